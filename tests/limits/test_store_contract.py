"""Every limit store keeps the same contract: exact windows, all-or-nothing reservations under
concurrency, settlement, and expiry of leases nobody settles (memory, Postgres, Redis)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from llmgw.limits.memory import MemoryLimitStore
from llmgw.limits.postgres import PostgresLimitStore
from llmgw.limits.store import Admission, Charge, LimitStore, Reservation, Window

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
BACKENDS = ["memory", "postgres", pytest.param("redis", marks=pytest.mark.skipif(
    not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis"))]  # fmt: skip


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[LimitStore]:
    made: LimitStore
    if request.param == "memory":
        made = MemoryLimitStore()
    elif request.param == "postgres":
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
        made = PostgresLimitStore(pool, database_url)
    else:
        from llmgw.limits.redis import RedisLimitStore

        assert REDIS_URL is not None
        made = RedisLimitStore(REDIS_URL, key_prefix=f"llmgw-test:{uuid.uuid4().hex}")
    await made.start()
    yield made
    await made.close()
    if request.param == "postgres":
        await pool.close()


async def new_key(db: asyncpg.Connection) -> uuid.UUID:
    key_id: uuid.UUID = await db.fetchval(
        "INSERT INTO api_keys (name, prefix, key_hash) VALUES ('k', $1, $2) RETURNING id",
        "llmg_" + uuid.uuid4().hex[:7],
        os.urandom(32),
    )
    return key_id


def admission(counter: str, cap: float, amount: float, *, lease_seconds: float = 30.0) -> Admission:
    return Admission(
        lease_id=uuid.uuid4(),
        lease_seconds=lease_seconds,
        window=None,
        reservations=(Reservation(counter, cap, amount, keep_seconds=120),),
    )


async def test_a_window_admits_exactly_its_limit(store: LimitStore, db: asyncpg.Connection) -> None:
    window = Window(await new_key(db), limit=10, seconds=60)
    decisions = await asyncio.gather(*(store.hit(window) for _ in range(30)))
    assert sum(d.allowed for d in decisions) == 10
    assert min(d.remaining for d in decisions) == 0
    assert all(0 < d.reset_seconds <= 60 for d in decisions)


async def test_concurrent_reservations_never_exceed_the_cap(store: LimitStore) -> None:
    counter = f"budget:{uuid.uuid4()}:2026-12"
    results = await asyncio.gather(*(store.admit(admission(counter, 5.0, 1.0)) for _ in range(30)))
    assert sum(r.admitted for r in results) == 5
    assert await store.usage(counter) == (0.0, 5.0)


async def test_settling_gives_back_the_difference(store: LimitStore) -> None:
    counter = f"tokens:{uuid.uuid4()}:0"
    first = admission(counter, 100.0, 60.0)
    assert (await store.admit(first)).admitted
    assert not (await store.admit(admission(counter, 100.0, 60.0))).admitted
    await store.settle([Charge(first.lease_id, counter, 10.0)])
    await store.settle([Charge(first.lease_id, counter, 0.0)])  # settling twice: nothing more
    assert await store.usage(counter) == (10.0, 0.0)
    assert (await store.admit(admission(counter, 100.0, 60.0))).admitted


async def test_a_refusal_reserves_nothing_and_counts_no_request(
    store: LimitStore, db: asyncpg.Connection
) -> None:
    window = Window(await new_key(db), limit=1, seconds=60)
    fits, too_big = (Reservation(f"c:{uuid.uuid4()}", cap, 1.0, 120) for cap in (5.0, 0.5))
    refused = await store.admit(Admission(uuid.uuid4(), 30.0, window, (fits, too_big)))
    assert refused.refused == too_big
    assert await store.usage(fits.counter) == (0.0, 0.0)
    assert (await store.hit(window)).allowed  # the refused request took no place in the window


async def test_an_unsettled_lease_expires(store: LimitStore) -> None:
    counter = f"concurrency:{uuid.uuid4()}"
    assert (await store.admit(admission(counter, 1.0, 1.0, lease_seconds=0.3))).admitted
    assert not (await store.admit(admission(counter, 1.0, 1.0))).admitted
    await asyncio.sleep(0.5)
    assert (await store.admit(admission(counter, 1.0, 1.0))).admitted


async def test_a_renewed_lease_does_not_expire(store: LimitStore) -> None:
    counter = f"concurrency:{uuid.uuid4()}"
    held = admission(counter, 1.0, 1.0, lease_seconds=0.3)
    assert (await store.admit(held)).admitted
    await store.renew([(held.lease_id, (counter,))], 30.0)
    await asyncio.sleep(0.5)
    assert not (await store.admit(admission(counter, 1.0, 1.0))).admitted
