"""Authentication, rate limiting and the headers every authenticated response carries."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from llmgw import app_keys
from llmgw.key_format import hash_key
from tests.conftest import Gateway
from tests.processes import eventually

BODY = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}


async def post(
    gateway: Gateway, headers: dict[str, str], body: object = BODY
) -> tuple[int, dict, object]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url("/v1/chat/completions"), json=body, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.json()


async def test_key_is_stored_only_as_prefix_and_hash(gateway: Gateway, api_key: str) -> None:
    row = await gateway.db.fetchrow("SELECT * FROM api_keys")
    assert row["prefix"] == api_key[:12]
    assert bytes(row["key_hash"]) == hash_key(api_key)
    assert api_key not in " ".join(str(value) for value in row.values())


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer llmg_short",
        "Bearer llmg_unknownprefix_but_long_enough_to_look_real",
        "Bearer \u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9",
    ],
)
async def test_missing_malformed_or_unknown_keys_get_one_401(
    gateway: Gateway, api_key: str, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    status, response_headers, body = await post(gateway, headers)
    assert status == 401
    assert response_headers["WWW-Authenticate"] == "Bearer"
    assert body == {
        "error": {
            "message": "Invalid API key. Send 'Authorization: Bearer <your llmgw key>'.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    assert gateway.fake.received == []


async def test_right_prefix_wrong_secret_gets_the_same_401(gateway: Gateway, api_key: str) -> None:
    forged = api_key[:12] + "x" * (len(api_key) - 12)
    status, _, body = await post(gateway, {"Authorization": f"Bearer {forged}"})
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"


async def test_revoked_key_is_refused_within_a_second_despite_the_cache(
    gateway: Gateway, api_key: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    assert (await post(gateway, headers))[0] == 200  # now cached
    await gateway.db.execute(
        "UPDATE api_keys SET is_active = false, revoked_at = now() WHERE prefix = $1", api_key[:12]
    )

    async def refused() -> bool:
        return (await post(gateway, headers))[0] == 401

    await eventually(refused, within=1.0, what="the revocation seen")


async def test_last_used_at_is_written_off_the_request_path(gateway: Gateway, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    for _ in range(3):
        assert (await post(gateway, headers))[0] == 200
    assert await gateway.db.fetchval("SELECT last_used_at FROM api_keys") is None
    authenticator = gateway.server.app[app_keys.AUTHENTICATOR]
    await authenticator._flush_last_used()
    assert await gateway.db.fetchval("SELECT last_used_at FROM api_keys") is not None


async def test_thirty_concurrent_requests_against_a_limit_of_ten_admit_exactly_ten(
    gateway: Gateway,
) -> None:
    key = await gateway.create_key(rate_limit_requests=10, rate_limit_window_seconds=60)
    headers = {"Authorization": f"Bearer {key}"}
    results = await asyncio.gather(*(post(gateway, headers) for _ in range(30)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200] * 10 + [429] * 20
    refused = next(r for r in results if r[0] == 429)
    assert refused[2]["error"]["type"] == "rate_limit_error"
    assert 1 <= int(refused[1]["Retry-After"]) <= 60
    assert refused[1]["x-ratelimit-remaining-requests"] == "0"
    assert len(gateway.fake.received) == 10


async def test_every_authenticated_response_carries_rate_limit_headers(
    gateway: Gateway,
) -> None:
    key = await gateway.create_key(rate_limit_requests=5, rate_limit_window_seconds=30)
    headers = {"Authorization": f"Bearer {key}"}
    _, first, _ = await post(gateway, headers)
    _, second, _ = await post(gateway, headers, body={"model": ""})  # a 400 still counts
    assert first["x-ratelimit-limit-requests"] == "5"
    assert first["x-ratelimit-remaining-requests"] == "4"
    assert second["x-ratelimit-remaining-requests"] == "3"
    assert 1 <= int(first["x-ratelimit-reset-requests"].rstrip("s")) <= 30


async def test_expired_windows_are_pruned(gateway: Gateway, api_key: str) -> None:
    key_id = await gateway.db.fetchval("SELECT id FROM api_keys")
    await gateway.db.execute(
        "INSERT INTO api_key_rate_limit_windows VALUES ($1, now() - interval '1 hour', 60, 3)",
        key_id,
    )
    assert (await post(gateway, {"Authorization": f"Bearer {api_key}"}))[0] == 200
    leased = gateway.server.app[app_keys.LIMITS].store  # capacity leases, over Postgres
    assert await leased.store.prune() == 1  # type: ignore[attr-defined]
    # The window running now is a counter (capacity leases are on by default), kept.
    assert await gateway.db.fetchval("SELECT count(*) FROM api_key_rate_limit_windows") == 0
    assert (
        await gateway.db.fetchval(
            "SELECT count(*) FROM limit_counters WHERE counter LIKE 'window:%'"
        )
        == 1
    )
