"""The admin API: keys issued, listed, patched, rotated and revoked; budgets; every action audited."""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from llmgw import app_keys
from llmgw.clocks import Clocks
from tests.conftest import Gateway
from tests.fake_venice import Behaviour
from tests.processes import Clock, eventually

ADMIN_TOKEN = "admin-token-for-tests-0123456789"
CHAT = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}


class Admin:
    def __init__(self, gateway: Gateway, session: aiohttp.ClientSession, clock: Clock) -> None:
        self.gateway = gateway
        self.session = session
        self.clock = clock  # the gateway's wall clock (a key's expiry); the database keeps its own

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = ADMIN_TOKEN, **kw: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        async with self.session.request(
            method, self.gateway.url(f"/admin/v1{path}"), json=body, headers=headers, **kw
        ) as response:
            return response.status, await response.json()

    async def chat(self, key: str, **body: Any) -> int:
        async with self.session.post(
            self.gateway.url("/v1/chat/completions"),
            json={**CHAT, **body},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            await response.read()
            return response.status


@pytest.fixture
async def admin(start_gateway: Any) -> Any:
    clock = Clock(time.time())
    gateway = await start_gateway(admin_token=ADMIN_TOKEN, clocks=Clocks(wall=clock))
    async with aiohttp.ClientSession() as session:
        yield Admin(gateway, session, clock)


async def test_admin_api_is_404_when_no_token_is_configured(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        for method, path in (("GET", "/admin/v1/keys"), ("POST", "/admin/v1/keys")):
            async with session.request(
                method, gateway.url(path), headers={"Authorization": "Bearer whatever-token-here"}
            ) as response:
                assert response.status == 404
                assert (await response.json())["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef", ADMIN_TOKEN + "x"])
async def test_wrong_or_missing_admin_token_is_401(admin: Admin, token: str | None) -> None:
    status, body = await admin.call("GET", "/keys", token=token)
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"


async def test_wrong_admin_tokens_are_throttled_per_address_and_logged(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.admin.sign_in_guard")
    statuses = [
        (await admin.call("GET", "/keys", token=f"guess-{n}-0123456789"))[0] for n in range(300)
    ]
    assert statuses == [401] * 10 + [429] * 290
    async with admin.session.get(
        admin.gateway.url("/admin/v1/keys"), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ) as response:
        assert response.status == 429  # the right token waits too: no oracle while throttled
        assert 1 <= int(response.headers["Retry-After"]) <= 6
    lines = [r for r in caplog.records if r.name == "llmgw.admin.sign_in_guard"]
    assert [r.getMessage() for r in lines[:11]] == ["admin sign-in failed"] * 10 + [
        "admin sign-ins throttled"
    ]
    assert len(lines) <= 12  # 291 refusals in a line or two, with their count
    assert lines[0].route == "/admin/v1/keys"  # type: ignore[attr-defined]
    assert "guess-" not in " ".join(str(vars(r)) for r in lines)


async def test_gateway_keys_do_not_open_the_admin_api(admin: Admin) -> None:
    key = await admin.gateway.create_key()
    status, _ = await admin.call("GET", "/keys", token=key)
    assert status == 401


async def test_key_lifecycle_through_the_admin_api(admin: Admin) -> None:
    subject = str(uuid.uuid4())
    status, created = await admin.call(
        "POST",
        "/keys",
        {"name": "team-a", "subject_id": subject, "rate_limit_requests": 5, "allowed_models": []},
    )
    assert status == 201
    plaintext = created.pop("key")
    assert plaintext.startswith("llmg_")
    assert created["prefix"] == plaintext[:12]
    assert created["subject_id"] == subject
    assert created["is_active"] is True
    expected_fields = {
        "id", "prefix", "name", "subject_id", "rate_limit_requests", "rate_limit_window_seconds",
        "allowed_models", "expires_at", "tokens_per_minute", "max_concurrent_requests", "is_active",
        "created_at",
        "last_used_at", "revoked_at", "replaced_by", "team_id", "owner",
    }  # fmt: skip
    assert set(created) == expected_fields
    assert await admin.chat(plaintext) == 200

    status, fetched = await admin.call("GET", f"/keys/{created['id']}")
    assert status == 200
    assert "key" not in fetched
    assert plaintext not in json.dumps(fetched)

    status, listed = await admin.call("GET", f"/keys?subject_id={subject}&state=active")
    assert [k["id"] for k in listed["data"]] == [created["id"]]

    status, patched = await admin.call(
        "PATCH", f"/keys/{created['id']}", {"name": "team-a-renamed", "rate_limit_requests": 9}
    )
    assert status == 200
    assert (patched["name"], patched["rate_limit_requests"]) == ("team-a-renamed", 9)

    status, rotated = await admin.call("POST", f"/keys/{created['id']}/rotate")
    assert status == 201
    assert rotated["key"] != plaintext
    assert rotated["rate_limit_requests"] == 9
    assert rotated["replaces"]["is_active"] is False
    assert rotated["replaces"]["replaced_by"] == rotated["id"]
    await eventually(lambda: _key_refused(admin, plaintext), within=1.0)
    assert await admin.chat(rotated["key"]) == 200

    status, revoked = await admin.call("POST", f"/keys/{rotated['id']}/revoke")
    assert status == 200
    assert revoked["is_active"] is False
    await eventually(lambda: _key_refused(admin, rotated["key"]), within=1.0)

    rows = await admin.gateway.db.fetch("SELECT * FROM admin_audit ORDER BY id")
    assert [row["action"] for row in rows] == [
        "key.create", "key.update", "key.rotate", "key.create", "key.revoke",
    ]  # fmt: skip
    dump = " ".join(str(dict(row)) for row in rows)
    for secret in (plaintext, rotated["key"], ADMIN_TOKEN):
        assert secret not in dump
    assert json.loads(rows[1]["before"])["name"] == "team-a"
    assert json.loads(rows[1]["after"])["name"] == "team-a-renamed"
    assert all(row["actor"].startswith("token:") for row in rows)


async def test_audit_names_a_caller_supplied_actor(admin: Admin) -> None:
    await admin.call("POST", "/keys", {"name": "x"}, headers={"X-Admin-Actor": "alice@example"})
    assert await admin.gateway.db.fetchval("SELECT actor FROM admin_audit") == "alice@example"


async def test_rotation_with_grace_keeps_the_old_key_working_for_a_while(admin: Admin) -> None:
    _, created = await admin.call("POST", "/keys", {"name": "graceful"})
    status, rotated = await admin.call(
        "POST", f"/keys/{created['id']}/rotate", {"grace_seconds": 1.5}
    )
    assert status == 201
    # The old key says what replaced it, still active until its grace ends.
    assert rotated["replaces"]["replaced_by"] == rotated["id"]
    assert rotated["replaces"]["is_active"] is True
    grace_ends = datetime.fromisoformat(rotated["replaces"]["expires_at"]).timestamp()
    assert grace_ends - time.time() == pytest.approx(1.5, abs=1.0)
    assert await admin.chat(created["key"]) == 200
    assert await admin.chat(rotated["key"]) == 200
    admin.clock.now = grace_ends - 0.01
    assert await admin.chat(created["key"]) == 200
    admin.clock.now = grace_ends
    assert await admin.chat(created["key"]) == 401
    assert await admin.chat(rotated["key"]) == 200


async def test_expired_keys_are_refused_like_revoked_ones(admin: Admin) -> None:
    _, created = await admin.call("POST", "/keys", {"name": "short-lived"})
    assert await admin.chat(created["key"]) == 200
    soon = math.floor(admin.clock.now) + 2
    status, _ = await admin.call("PATCH", f"/keys/{created['id']}", {"expires_at": _iso(soon)})
    assert status == 200
    assert await admin.chat(created["key"]) == 200
    admin.clock.now = soon
    assert await admin.chat(created["key"]) == 401
    # The listing reads the database's clock, which no test moves: an expiry already past there.
    status, _ = await admin.call(
        "PATCH", f"/keys/{created['id']}", {"expires_at": _iso(math.floor(time.time()) - 1)}
    )
    assert status == 200
    _, listed = await admin.call("GET", "/keys?state=expired")
    assert [k["id"] for k in listed["data"]] == [created["id"]]


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": ""},
        {"name": "x", "rate_limit_requests": 0},
        {"name": "x", "rate_limit_requests": "ten"},
        {"name": "x", "subject_id": "not-a-uuid"},
        {"name": "x", "expires_at": "tomorrow"},
        {"name": "x", "expires_at": "2027-01-01T00:00:00"},
        {"name": "x", "allowed_models": [""]},
        {"name": "x", "unknown_field": 1},
        ["name", "x"],
        {"name": "nul\u0000name"},
        {"name": "x", "allowed_models": ["qwen\u0000"]},
        {"name": "x", "allowed_models": "abc"},  # a string is not a list of three models
        {"name": "x", "allowed_models": {"a": 1}},
    ],
)
async def test_invalid_key_bodies_are_400(admin: Admin, body: Any) -> None:
    status, answer = await admin.call("POST", "/keys", body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert await admin.gateway.db.fetchval("SELECT count(*) FROM api_keys") == 0


async def test_patched_names_and_model_lists_are_checked_like_new_ones(admin: Admin) -> None:
    _, created = await admin.call("POST", "/keys", {"name": "x", "allowed_models": ["a"]})
    for change in (
        {"name": "nul\u0000"},
        {"allowed_models": "abc"},
        {"allowed_models": ["\u0000"]},
    ):
        status, answer = await admin.call("PATCH", f"/keys/{created['id']}", change)
        assert status == 400, (change, answer)
        assert answer["error"]["type"] == "invalid_request_error"
    _, after = await admin.call("GET", f"/keys/{created['id']}")
    assert (after["name"], after["allowed_models"]) == ("x", ["a"])


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("to=0001-01-01", "$.to"),
        ("from=0001-01-01&to=0001-01-02", "$.from_"),
        ("to=9999-12-31", "$.to"),
        ("from=2026-13-01", "$.from_"),
        ("by=week", "by must be one of"),
        ("key_id=nope", "$.key_id"),
    ],
)
async def test_report_parameters_out_of_range_are_400(admin: Admin, query: str, named: str) -> None:
    for csv in ("", "&format=csv"):
        status, answer = await admin.call("GET", f"/usage/report?{query}{csv}")
        assert status == 400, (query, answer)
        assert named in answer["error"]["message"]


async def test_patch_rejects_fields_that_cannot_change(admin: Admin) -> None:
    _, created = await admin.call("POST", "/keys", {"name": "x"})
    status, answer = await admin.call("PATCH", f"/keys/{created['id']}", {"prefix": "llmg_hacked1"})
    assert status == 400
    assert "prefix" in answer["error"]["message"]
    status, _ = await admin.call("PATCH", f"/keys/{uuid.uuid4()}", {"name": "y"})
    assert status == 404


async def test_listing_is_paginated(admin: Admin) -> None:
    for index in range(5):
        await admin.call("POST", "/keys", {"name": f"k{index}"})
    _, first = await admin.call("GET", "/keys?limit=2")
    _, second = await admin.call("GET", f"/keys?limit=2&offset={first['next_offset']}")
    _, last = await admin.call("GET", "/keys?limit=2&offset=4")
    assert [k["name"] for k in first["data"] + second["data"] + last["data"]] == [
        "k0", "k1", "k2", "k3", "k4",
    ]  # fmt: skip
    assert (first["has_more"], last["has_more"]) == (True, False)


async def test_subject_budget_is_set_shown_and_cleared(admin: Admin) -> None:
    subject = str(uuid.uuid4())
    status, shown = await admin.call("PUT", f"/subjects/{subject}", {"monthly_budget_usd": 12.5})
    assert status == 200
    assert shown["monthly_budget_usd"] == 12.5
    assert shown["month_to_date_spend_usd"] == 0
    status, shown = await admin.call("GET", f"/subjects/{subject}")
    assert shown["monthly_budget_usd"] == 12.5
    _, cleared = await admin.call("PUT", f"/subjects/{subject}", {"monthly_budget_usd": None})
    assert cleared["monthly_budget_usd"] is None
    status, _ = await admin.call("PUT", f"/subjects/{subject}", {"monthly_budget_usd": -1})
    assert status == 400


async def test_the_overview_counts_requests_the_gateway_refused(admin: Admin) -> None:
    """401, 413 and 429 never reach a provider, so the ledger has no row of them; the overview
    counts them all the same (a provider's own errors stay in the ledger's error counts)."""
    key = await admin.gateway.create_key(rate_limit_requests=1)
    assert await admin.chat(key) == 200
    assert await admin.chat(key) == 429
    assert await admin.chat("llmg_not-a-key-at-all-0123456789") == 401
    huge = "x" * (admin.gateway.server.app[app_keys.SETTINGS].request_body_limit_bytes + 1)
    other = await admin.gateway.create_key()
    assert await admin.chat(other, user=huge) == 413
    admin.gateway.fake.enqueue(Behaviour(status=400))
    assert await admin.chat(other) == 400  # the provider's refusal: in the ledger, not here
    expected = [
        {"status": 401, "code": "invalid_api_key", "requests": 1},
        {"status": 413, "code": "request_too_large", "requests": 1},
        {"status": 429, "code": "rate_limit_exceeded", "requests": 1},
    ]

    async def counted() -> bool:
        _, overview = await admin.call("GET", "/overview")
        return bool(overview["last_hour"]["refused"] == overview["today"]["refused"] == expected)

    await eventually(counted, within=10, what="the refusals counted")


async def _key_refused(admin: Any, key: str) -> bool:
    return bool(await admin.chat(key) == 401)


BIG = 2**31
OUT_OF_RANGE_KEYS = [
    {"name": "x", "rate_limit_requests": BIG},
    {"name": "x", "rate_limit_window_seconds": BIG},
    {"name": "x", "tokens_per_minute": BIG},
    {"name": "x", "rate_limit_requests": 10**30},
    {"name": "x", "expires_at": "9999-12-31T23:59:59-23:00"},
    {"name": "x", "expires_at": "0001-01-01T00:00:00+05:00"},
]


@pytest.mark.parametrize("body", OUT_OF_RANGE_KEYS)
async def test_key_fields_beyond_what_the_database_holds_are_400(admin: Admin, body: Any) -> None:
    status, answer = await admin.call("POST", "/keys", body)
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"


async def test_out_of_range_rotation_paging_patching_and_usage_are_400(admin: Admin) -> None:
    status, created = await admin.call("POST", "/keys", {"name": "ranges"})
    assert status == 201
    key_id = created["id"]
    for method, path, body in (
        ("POST", f"/keys/{key_id}/rotate", {"grace_seconds": 1e12}),
        ("PATCH", f"/keys/{key_id}", {"rate_limit_requests": BIG}),
        ("GET", f"/keys?offset={10**20}", None),
        ("GET", "/usage?from=9999-12-31T23:59:59-23:00", None),
    ):
        status, answer = await admin.call(method, path, body)
        assert status == 400, (path, answer)
    status, _ = await admin.call("GET", f"/keys/{key_id}")
    assert status == 200


@pytest.mark.parametrize("budget", [1e10, 1e-9, 4e-9, -1, 1e300])
async def test_budgets_the_database_cannot_store_exactly_are_400(
    admin: Admin, budget: float
) -> None:
    status, answer = await admin.call(
        "PUT", f"/subjects/{uuid.uuid4()}", {"monthly_budget_usd": budget}
    )
    assert status == 400, answer
    assert "monthly_budget_usd" in answer["error"]["message"]


@pytest.mark.parametrize("budget", [0, 1e-8, 9_999_999_999.0])
async def test_budgets_at_the_edges_are_stored(admin: Admin, budget: float) -> None:
    status, answer = await admin.call(
        "PUT", f"/subjects/{uuid.uuid4()}", {"monthly_budget_usd": budget}
    )
    assert status == 200, answer
    assert float(answer["monthly_budget_usd"]) > 0 or budget == 0


async def test_max_concurrent_requests_is_set_checked_and_cleared(admin: Any) -> None:
    status, created = await admin.call("POST", "/keys", {"name": "c", "max_concurrent_requests": 2})
    assert (status, created["max_concurrent_requests"]) == (201, 2)
    status, refused = await admin.call("POST", "/keys", {"name": "c", "max_concurrent_requests": 0})
    assert (status, refused["error"]["type"]) == (400, "invalid_request_error")
    path = f"/keys/{created['id']}"
    status, changed = await admin.call("PATCH", path, {"max_concurrent_requests": None})
    assert (status, changed["max_concurrent_requests"]) == (200, None)
