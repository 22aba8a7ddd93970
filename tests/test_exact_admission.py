"""Exact admission over two gateway processes, with Postgres and with Redis as the limit store:
budgets and tokens per minute reserve the worst case before the provider is called, so 30
concurrent requests never spend more than the cap; concurrency slots hold across replicas."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import aiohttp
import asyncpg
import pytest

from llmgw.accounting.estimate import estimate_input_tokens
from llmgw.accounting.prices import Price
from llmgw.storage import api_keys
from tests.conftest import GatewayProcess, StartGateways, gateway_env
from tests.fake_venice import Behaviour, FakeVenice, expected_cost_usd
from tests.processes import eventually

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
MESSAGES = [{"role": "user", "content": "hi"}]  # 1 prompt token at the fake
BODY = {"model": "qwen3-5-9b", "messages": MESSAGES, "max_tokens": 5}  # the fake answers 5
QWEN = Price(0.1, 150.0)  # what the fake lists (and bills) for qwen3-5-9b
WORST_TOKENS = estimate_input_tokens(BODY) + 5
WORST_COST = QWEN.worst_cost(estimate_input_tokens(BODY), 5)
ACTUAL_COST = expected_cost_usd(1, 5)
ACTUAL_TOKENS = 1 + 5


# The limit stores every exactness test runs on, and the settings that choose each.
STORES = [
    "postgres",
    pytest.param(
        "redis",
        marks=pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL"),
    ),
    "postgres with slices",  # capacity leases (docs/accounting.md)
]


def store_env(store: str) -> dict[str, str]:
    return {
        "postgres": {},
        "redis": {"RATE_LIMIT_BACKEND": "redis", "REDIS_URL": REDIS_URL or ""},
        # Every key takes slices (by default only busy ones do: these bursts are quiet).
        "postgres with slices": {"LIMIT_SLICE_BUSY_RATE": "0"},
    }[store]


@pytest.fixture(params=STORES)
def two_gateways(
    request: pytest.FixtureRequest,
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
) -> list[GatewayProcess]:
    env = gateway_env(database_url, fake_venice.base_url, **store_env(request.param))
    return gateway_processes(env, count=2)


async def burst(
    gateways: list[GatewayProcess], key: str, count: int = 30, **body: Any
) -> list[tuple[int, dict[str, Any]]]:
    async with aiohttp.ClientSession() as session:

        async def one(index: int) -> tuple[int, dict[str, Any]]:
            async with session.post(
                f"{gateways[index % 2].url}/v1/chat/completions",
                json={**BODY, **body},
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                return response.status, await response.json(content_type=None)

        return await asyncio.gather(*(one(index) for index in range(count)))


async def test_a_budget_worth_five_worst_cases_admits_five(
    two_gateways: list[GatewayProcess], db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    subject = uuid.uuid4()
    cap = 5 * WORST_COST
    await db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, $2)", subject, cap
    )
    issued = await api_keys.create_key(
        db, api_keys.KeySettings(name="budget", subject_id=subject, rate_limit_requests=1000)
    )
    results = await burst(two_gateways, issued.plaintext)
    admitted = [body for status, body in results if status == 200]
    refused = [body for status, body in results if status != 200]
    assert {body["error"]["code"] for body in refused} == {"budget_exceeded"}
    # Each settles below its worst case, but what is left never fits another worst case.
    assert len(admitted) == 5
    assert len(fake_venice.chats()) == 5  # refused before any upstream call

    async def spent() -> float:
        value = await db.fetchval(
            "SELECT coalesce(sum(cost_usd), 0)::float8 FROM usage_events WHERE subject_id = $1",
            subject,
        )
        return float(value)

    async def rows() -> int:
        return int(await db.fetchval("SELECT count(*) FROM usage_events"))

    async def five_rows() -> bool:
        return await rows() >= 5  # refusals have no row

    await eventually(five_rows, within=10)
    # Nothing more arrives: each gateway writes its rows in the order they were queued, so once a
    # later request's row is written on both, nothing the burst queued is left to come.
    later = await api_keys.create_key(db, api_keys.KeySettings(name="later"))
    assert [status for status, _ in await burst(two_gateways, later.plaintext, count=2)] == [
        200
    ] * 2

    async def later_rows() -> bool:
        count = await db.fetchval(
            "SELECT count(*) FROM usage_events WHERE api_key_id = $1", later.record.id
        )
        return int(count) == 2

    await eventually(later_rows, within=10)
    assert await rows() == 5 + 2
    assert await spent() == pytest.approx(5 * ACTUAL_COST)
    assert await spent() <= cap


async def test_tokens_per_minute_admit_no_more_tokens_than_the_limit(
    two_gateways: list[GatewayProcess], db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    limit = 5 * WORST_TOKENS
    # All of a burst inside one minute window (the windows are the gateways' wall-clock minutes):
    # a burst that straddled two is done again with a new key, which the next cannot (it lasts
    # seconds, not a minute).
    for _ in range(2):
        minute, calls_before = time.time() // 60, len(fake_venice.chats())
        issued = await api_keys.create_key(
            db, api_keys.KeySettings(name="tpm", tokens_per_minute=limit, rate_limit_requests=1000)
        )
        results = await burst(two_gateways, issued.plaintext)
        if time.time() // 60 == minute:
            break
    admitted = sum(1 for status, _ in results if status == 200)
    refused = {body["error"]["code"] for status, body in results if status != 200}
    assert refused == {"tokens_per_minute_exceeded"}
    assert admitted >= 5
    assert admitted * ACTUAL_TOKENS <= limit
    assert len(fake_venice.chats()) - calls_before == admitted


async def test_concurrency_slots_hold_across_replicas_and_free_when_requests_end(
    two_gateways: list[GatewayProcess],
    db: asyncpg.Connection,
    fake_venice: FakeVenice,
    request: pytest.FixtureRequest,
) -> None:
    issued = await api_keys.create_key(
        db, api_keys.KeySettings(name="slots", max_concurrent_requests=3, rate_limit_requests=1000)
    )
    fake_venice.default_behaviour.delay_before_headers = 1.0
    try:
        results = await burst(two_gateways, issued.plaintext)
    finally:
        fake_venice.default_behaviour.delay_before_headers = 0.0
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 3 + [429] * 27
    codes = {body["error"]["code"] for status, body in results if status == 429}
    assert codes == {"concurrency_limit_exceeded"}
    # The slots were given back when the requests ended (each settlement is sent just after its
    # answer): one after another, twice as many requests as slots are all admitted.
    async with aiohttp.ClientSession() as session:
        for index in range(6):
            fake_venice.enqueue(Behaviour(chunk_delay=0.01))

            async def admitted(index: int = index) -> bool:
                async with session.post(
                    f"{two_gateways[index % 2].url}/v1/chat/completions",
                    json={**BODY, "stream": index % 2 == 0},
                    headers={"Authorization": f"Bearer {issued.plaintext}"},
                ) as response:
                    await response.read()
                    return response.status == 200

            await eventually(admitted, within=5, what=f"request {index} admitted")
    # With capacity leases on (the default) the window is a counter in Postgres, the one busy
    # keys take slices of, whether this key was quiet or busy.
    windows = await db.fetchval("SELECT count(*) FROM limit_counters WHERE counter LIKE 'window:%'")
    assert bool(windows) == request.node.callspec.params["two_gateways"].startswith("postgres")
