"""Every limit store keeps the same contract: exact windows, all-or-nothing reservations under
concurrency, settlement, expiry of leases nobody settles, and cancellation of admissions whose
caller gave up (memory, Postgres, Redis), also through a real stall of Postgres or Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import asyncpg
import pytest

from llmgw.accounting.prices import PriceTable
from llmgw.auth.authenticator import TeamLimits
from llmgw.errors import RateLimited, ServiceUnavailable
from llmgw.limits.leases import LeasedLimitStore
from llmgw.limits.memory import MemoryLimitStore
from llmgw.limits.policy import LimitPolicy
from llmgw.limits.postgres import PostgresLimitStore
from llmgw.limits.store import Admission, Charge, LimitStore, Reservation, Window
from tests.limits import replica
from tests.limits.test_policy import admit, key
from tests.processes import REPO_ROOT, eventually
from tests.stall_proxy import StallProxy

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
REDIS = pytest.param("redis", marks=[pytest.mark.redis, pytest.mark.skipif(
    not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis")])  # fmt: skip
BACKENDS = ["memory", "postgres", REDIS]


@contextlib.asynccontextmanager
async def started_store(backend: str, database_url: str) -> AsyncIterator[LimitStore]:
    """A started limit store of ``backend`` (memory, postgres or redis, on keys of its own)."""
    made: LimitStore
    if backend == "memory":
        made = MemoryLimitStore()
    elif backend == "postgres":
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
        made = PostgresLimitStore(pool, database_url)
    else:
        from llmgw.limits.redis import RedisLimitStore

        assert REDIS_URL is not None
        made = RedisLimitStore(REDIS_URL, key_prefix=f"llmgw-test:{uuid.uuid4().hex}")
    await made.start()
    try:
        yield made
    finally:
        await made.close()
        if backend == "postgres":
            await pool.close()


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[LimitStore]:
    async with started_store(request.param, database_url) as made:
        yield made


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
    # An hour's window: thirty hits on a loaded machine may take long enough to straddle a minute's
    # boundary, which admits ten in each window (CI once saw 20).
    window = Window(await new_key(db), limit=10, seconds=3600)
    decisions = await asyncio.gather(*(store.hit(window) for _ in range(30)))
    assert sum(d.allowed for d in decisions) == 10
    assert min(d.remaining for d in decisions) == 0
    assert all(0 < d.reset_seconds <= 3600 for d in decisions)


async def test_concurrent_reservations_never_exceed_the_cap(store: LimitStore) -> None:
    counter = f"budget:{uuid.uuid4()}:2026-12"
    results = await asyncio.gather(*(store.admit(admission(counter, 5.0, 1.0)) for _ in range(30)))
    assert sum(r.admitted for r in results) == 5
    assert await store.usage(counter) == (0.0, 5.0)


async def test_an_admission_reports_what_each_counter_holds_with_it(store: LimitStore) -> None:
    first, second = f"a:{uuid.uuid4()}", f"b:{uuid.uuid4()}"

    def both(amount: float) -> Admission:
        return Admission(uuid.uuid4(), 30.0, None, (
            Reservation(first, 10.0, amount, keep_seconds=120),
            Reservation(second, 10.0, 2 * amount, keep_seconds=120),
        ))  # fmt: skip

    assert (await store.admit(both(1.0))).taken == (1.0, 2.0)
    held = both(2.0)
    assert (await store.admit(held)).taken == (3.0, 6.0)
    await store.settle([Charge(held.lease_id, first, 0.5), Charge(held.lease_id, second, 0.0)])
    assert (await store.admit(both(1.0))).taken == (2.5, 4.0)
    assert (await store.admit(both(4.0))).taken == ()  # refused: nothing taken


async def test_settling_gives_back_the_difference(store: LimitStore) -> None:
    counter = f"tokens:{uuid.uuid4()}:0"
    first = admission(counter, 100.0, 60.0)
    assert (await store.admit(first)).admitted
    assert not (await store.admit(admission(counter, 100.0, 60.0))).admitted
    await store.settle([Charge(first.lease_id, counter, 10.0)])
    await store.settle([Charge(first.lease_id, counter, 0.0)])  # settling twice: nothing more
    assert await store.usage(counter) == (10.0, 0.0)
    assert (await store.admit(admission(counter, 100.0, 60.0))).admitted


async def test_settlements_riding_along_are_settled_first_whatever_the_outcome(
    store: LimitStore,
) -> None:
    slot, before, after = (f"{kind}:{uuid.uuid4()}" for kind in ("m", "a", "z"))
    first = admission(slot, 1.0, 1.0)
    spent = [admission(before, 10.0, 4.0), admission(after, 10.0, 4.0)]
    for admitted in (first, *spent):
        assert (await store.admit(admitted)).admitted
    # Refused (the slot is held): the counters before and after it in the locking order are
    # settled all the same.
    charges = [Charge(spent[0].lease_id, before, 1.0), Charge(spent[1].lease_id, after, 2.0)]
    assert (await store.admit(admission(slot, 1.0, 1.0), charges)).refused is not None
    assert [await store.usage(c) for c in (before, after)] == [(1.0, 0.0), (2.0, 0.0)]
    # The slot's own release riding along with the next admission of it frees it first.
    second = admission(slot, 1.0, 1.0)
    assert (await store.admit(second, [Charge(first.lease_id, slot, 0.0)])).admitted
    assert await store.usage(slot) == (0.0, 1.0)


async def test_a_cancelled_or_window_refused_admission_still_settles_what_rides_along(
    store: LimitStore, db: asyncpg.Connection
) -> None:
    window = Window(await new_key(db), limit=1, seconds=60)
    counter = f"tokens:{uuid.uuid4()}:0"
    held = [admission(counter, 10.0, 4.0) for _ in range(2)]
    for admitted in held:
        assert (await store.admit(admitted)).admitted
    assert (await store.hit(window)).allowed  # the window is full now
    full = Admission(uuid.uuid4(), 30.0, window, (Reservation(counter, 10.0, 1.0, 120),))
    result = await store.admit(full, [Charge(held[0].lease_id, counter, 1.0)])
    assert result.window is not None and not result.window.allowed
    late = admission(counter, 10.0, 1.0)
    await store.cancel([(late.lease_id, (counter,))], 60.0)
    assert (await store.admit(late, [Charge(held[1].lease_id, counter, 2.0)])).cancelled
    assert await store.usage(counter) == (3.0, 0.0)


async def test_admissions_carrying_settlements_of_other_keys_never_deadlock(
    database_url: str, db: asyncpg.Connection
) -> None:
    """Three replicas' connections (12), each admitting for one key while settling the other's
    counters: locks taken in one order (window, then counters by name) never wait in a cycle
    (PostgreSQL would break one with an error after its deadlock_timeout)."""
    keys = [await new_key(db) for _ in range(2)]

    def admission_of(key_id: uuid.UUID) -> Admission:
        counters = (f"concurrency:{key_id}", f"tokens:{key_id}:0")
        return Admission(
            uuid.uuid4(),
            30.0,
            Window(key_id, 1_000_000, 60),
            tuple(Reservation(name, 1e9, 1.0, 120) for name in counters),
        )

    async def admitting(store: LimitStore, first: int) -> None:
        carried: list[Charge] = []
        for turn in range(first, first + 25):
            admitted = admission_of(keys[turn % 2])
            assert (await store.admit(admitted, carried)).admitted
            carried = [Charge(admitted.lease_id, r.counter, 1.0) for r in admitted.reservations]

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    stores = [PostgresLimitStore(pool, database_url) for _ in range(3)]
    try:
        await asyncio.gather(*(admitting(s, turn) for s in stores for turn in range(4)))
        usage = [await stores[0].usage(f"concurrency:{key_id}") for key_id in keys]
        assert sum(reserved for _, reserved in usage) == 12  # the last lease of each loop
        assert sum(used for used, _ in usage) == 12 * 24
    finally:
        for store in stores:
            await store.close()
        await pool.close()


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

    async def admitted() -> bool:  # the store's own clock (the server's) ends the lease
        return bool((await store.admit(admission(counter, 1.0, 1.0))).admitted)

    await eventually(admitted, within=5, what="the lease expired")


async def test_what_was_used_of_a_lease_stays_used_when_it_expires(store: LimitStore) -> None:
    counter = f"window:{uuid.uuid4()}:60:0"
    held = admission(counter, 10.0, 8.0, lease_seconds=0.3)
    assert (await store.admit(held)).admitted
    await store.use([Charge(held.lease_id, counter, 3.0)])
    assert await store.usage(counter) == (3.0, 5.0)
    assert not (await store.admit(admission(counter, 10.0, 3.0))).admitted  # still held

    async def rest_given_back() -> bool:
        return await store.usage(counter) == (3.0, 0.0)

    await eventually(rest_given_back, within=5, what="the unused part of the lease came back")
    assert (await store.admit(admission(counter, 10.0, 7.0))).admitted
    assert not (await store.admit(admission(counter, 10.0, 1.0))).admitted


async def test_using_then_settling_a_lease_charges_both(store: LimitStore) -> None:
    counter = f"window:{uuid.uuid4()}:60:0"
    held = admission(counter, 10.0, 8.0)
    assert (await store.admit(held)).admitted
    await store.use([Charge(held.lease_id, counter, 2.0)])
    await store.use([Charge(held.lease_id, counter, 1.0)])
    await store.settle([Charge(held.lease_id, counter, 4.0)])
    assert await store.usage(counter) == (7.0, 0.0)
    await store.use([Charge(held.lease_id, counter, 1.0)])  # the lease is gone: charged anyway
    assert await store.usage(counter) == (8.0, 0.0)


async def test_a_renewed_lease_does_not_expire(store: LimitStore) -> None:
    counter, alongside = f"concurrency:{uuid.uuid4()}", f"concurrency:{uuid.uuid4()}"
    held = admission(counter, 1.0, 1.0, lease_seconds=0.3)
    assert (await store.admit(held)).admitted
    assert (await store.admit(admission(alongside, 1.0, 1.0, lease_seconds=0.3))).admitted
    await store.renew([(held.lease_id, (counter,))], 30.0)

    async def expired_alongside() -> bool:
        return bool((await store.admit(admission(alongside, 1.0, 1.0))).admitted)

    # Past the lease it was given, as the lease taken with it and not renewed shows: the store's
    # clock is the server's, which no test can move.
    await eventually(expired_alongside, within=5, what="the lease not renewed expired")
    assert not (await store.admit(admission(counter, 1.0, 1.0))).admitted


async def test_a_cancelled_admission_gives_back_what_it_reserved(store: LimitStore) -> None:
    counter = f"concurrency:{uuid.uuid4()}"
    landed = admission(counter, 1.0, 1.0)
    assert (await store.admit(landed)).admitted
    await store.cancel([(landed.lease_id, (counter,))], 60.0)
    await store.cancel([(landed.lease_id, (counter,))], 60.0)  # cancelling twice: nothing more
    assert await store.usage(counter) == (0.0, 0.0)
    assert (await store.admit(admission(counter, 1.0, 1.0))).admitted


async def test_an_admission_that_lands_after_its_cancel_is_refused(
    store: LimitStore, db: asyncpg.Connection
) -> None:
    window = Window(await new_key(db), limit=1, seconds=60)
    counter = f"concurrency:{uuid.uuid4()}"
    late = Admission(uuid.uuid4(), 30.0, window, (Reservation(counter, 1.0, 1.0, 120),))
    await store.cancel([(late.lease_id, (counter,))], 60.0)
    result = await store.admit(late)
    assert result.cancelled
    assert not result.admitted
    assert await store.usage(counter) == (0.0, 0.0)
    assert (await store.hit(window)).allowed  # it took no place in the window either


Stall = Callable[[str], AbstractAsyncContextManager[None]]


async def _no_lease_survives_a_stall(store: LimitStore, stall: Stall, key_id: uuid.UUID) -> None:
    """Two admissions cut off by a stall (the store's 2 s timeout) run once the store resumes;
    the key's two concurrency slots must be free again right after, not for a lease's 60 s."""
    limits = LimitPolicy(store, PriceTable(), lease_seconds=60)
    await limits.start()
    try:
        k = key(id=key_id, max_concurrent_requests=2)
        (await admit(limits, k)).settle(None)  # the counter exists; statements are ready
        assert await limits.flush()
        async with stall(f"concurrency:{k.id}"):
            cut_off = await asyncio.gather(
                admit(limits, k), admit(limits, k), return_exceptions=True
            )
            assert [type(outcome) for outcome in cut_off] == [ServiceUnavailable] * 2
        assert await limits.flush()
        await admit(limits, k)
        await admit(limits, k)
        with pytest.raises(RateLimited):
            await admit(limits, k)  # the cap still holds
    finally:
        await limits.close()


async def test_no_lease_survives_a_postgres_stall(
    database_url: str, db: asyncpg.Connection
) -> None:
    async def no_statement_runs() -> bool:
        running = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND datname = current_database() AND state = 'active' "
            "AND query LIKE '%llmgw_limits_%'"  # not another run's, on a shared server
        )
        return not running

    @contextlib.asynccontextmanager
    async def row_lock(counter: str) -> AsyncIterator[None]:
        """Another session holds the counter's row: admissions wait in the database."""
        locker = await asyncpg.connect(database_url)
        try:
            async with locker.transaction():
                await locker.execute(
                    "SELECT 1 FROM limit_counters WHERE counter = $1 FOR UPDATE", counter
                )
                yield
            # The waiting statements run now; wait until they have.
            await eventually(no_statement_runs, within=10, what="the waiting statements ran")
        finally:
            await locker.close()

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        store = PostgresLimitStore(pool, database_url)
        await _no_lease_survives_a_stall(store, row_lock, await new_key(db))
    finally:
        await pool.close()


@pytest.mark.redis
@pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis")
async def test_no_lease_survives_a_redis_stall(db: asyncpg.Connection) -> None:
    from llmgw.limits.redis import RedisLimitStore

    assert REDIS_URL is not None
    proxy, through = await StallProxy.before(REDIS_URL)

    @contextlib.asynccontextmanager
    async def network_stall(_counter: str) -> AsyncIterator[None]:
        proxy.pause()
        yield
        await proxy.resume()  # what was held back reaches Redis and runs

    try:
        store = RedisLimitStore(
            through,
            key_prefix=f"llmgw-test:{uuid.uuid4().hex}",
        )
        await _no_lease_survives_a_stall(store, network_stall, await new_key(db))
    finally:
        await proxy.close()


# Capacity leases (llmgw.limits.leases) over each store: replicas admit from slices they took.

StoreFactory = Callable[[], Awaitable[LimitStore]]


@pytest.fixture(params=BACKENDS)
async def new_store(
    request: pytest.FixtureRequest, database_url: str
) -> AsyncIterator[StoreFactory]:
    """Makes stores as separate replicas would have them (their own connections), on one backend;
    in memory they share the one store."""
    memory = MemoryLimitStore()
    pools: list[asyncpg.Pool] = []
    prefix = f"llmgw-test:{uuid.uuid4().hex}"

    async def make() -> LimitStore:
        if request.param == "memory":
            return memory
        if request.param == "postgres":
            pools.append(await asyncpg.create_pool(database_url, min_size=1, max_size=1))
            return PostgresLimitStore(pools[-1], database_url)
        from llmgw.limits.redis import RedisLimitStore

        assert REDIS_URL is not None
        return RedisLimitStore(REDIS_URL, key_prefix=prefix)

    yield make
    for pool in pools:
        await pool.close()


@pytest.mark.parametrize("busy_rate", [0.0, 200.0], ids=["sliced", "quiet"])
async def test_leased_replicas_admitting_at_once_never_exceed_any_cap(
    new_store: StoreFactory, busy_rate: float
) -> None:
    key_id = uuid.uuid4()
    replicas = [
        LeasedLimitStore(await new_store(), slice_seconds=5.0, busy_rate=busy_rate)
        for _ in range(4)
    ]
    for leased in replicas:
        await leased.start()
    try:
        results = await asyncio.gather(
            *(leased.admit(replica.admission(key_id)) for leased in replicas for _ in range(15))
        )
        admitted = sum(result.admitted for result in results)
        assert 0 < admitted <= replica.CONCURRENCY_CAP
        for reservation in replica.admission(key_id).reservations:
            used, reserved = await replicas[0].usage(reservation.counter)
            assert used + reserved <= reservation.cap
            assert reserved >= admitted * reservation.amount  # every admitted one is backed
    finally:
        for leased in replicas:
            await leased.close()


class _Replica:
    """``tests.limits.replica`` in a process of its own."""

    def __init__(self, backend: str, url: str, prefix: str, key_id: uuid.UUID, attempts: int):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.limits.replica", backend, url, prefix, str(key_id),
             str(attempts)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
        assert self._say("") == "ready\n"

    def _say(self, line: str) -> str:
        """Send ``line`` (if any), then read the answer."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        if line:
            self.process.stdin.write(line)
            self.process.stdin.flush()
        return self.process.stdout.readline()

    def start_admitting(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("admit\n")
        self.process.stdin.flush()

    def admitted(self) -> int:
        return int(self._say(""))

    def admit(self) -> int:
        self.start_admitting()
        return self.admitted()

    def release(self) -> None:
        assert self._say("release\n") == "closed\n"
        assert self.process.wait(timeout=30) == 0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", REDIS])
async def test_leased_replica_processes_never_exceed_any_cap_even_when_one_is_killed(
    backend: str, database_url: str
) -> None:
    url = database_url if backend == "postgres" else (REDIS_URL or "")
    prefix, key_id = f"llmgw-test:{uuid.uuid4().hex}", uuid.uuid4()

    def start(attempts: int) -> _Replica:
        return _Replica(backend, url, prefix, key_id, attempts)

    holders = [start(10) for _ in range(4)]  # 40 requests at once for 20 concurrency slots
    probes = [start(replica.CONCURRENCY_CAP) for _ in range(2)]
    try:
        for holder in holders:
            holder.start_admitting()  # all at once
        held = [holder.admitted() for holder in holders]
        assert 0 < sum(held) <= replica.CONCURRENCY_CAP
        killed = max(range(4), key=lambda i: held[i])
        holders[killed].kill()  # it holds its requests' slots, and perhaps more, unsettled
        before_expiry = probes[0].admit()
        assert before_expiry + sum(held) <= replica.CONCURRENCY_CAP  # not given back early
        probes[0].release()
        await asyncio.sleep(replica.SLICE_SECONDS + 0.5)  # the killed replica's lease expires
        after_expiry = probes[1].admit()
        assert after_expiry >= before_expiry + held[killed]  # its slice came back ...
        assert after_expiry + sum(held) - held[killed] <= replica.CONCURRENCY_CAP  # ... once
        probes[1].release()
        for i, holder in enumerate(holders):
            if i != killed:
                holder.release()
    finally:
        for process in [*holders, *probes]:
            if process.process.poll() is None:
                process.kill()


async def test_a_team_cap_holds_over_its_keys_on_every_store(
    store: LimitStore, db: asyncpg.Connection
) -> None:
    """A team is a level of the hierarchy: its counter is reserved in each key's admission, all or
    nothing, so sixteen callers on four keys of a team capped at five get exactly five."""
    limits = LimitPolicy(store, PriceTable([]), lease_seconds=30)
    shared = TeamLimits(id=uuid.uuid4(), max_concurrent_requests=5)
    keys = [key(id=await new_key(db), team=shared, max_concurrent_requests=2) for _ in range(4)]
    results = await asyncio.gather(
        *(admit(limits, keys[index % 4]) for index in range(16)), return_exceptions=True
    )
    refused = [result for result in results if isinstance(result, BaseException)]
    assert len(results) - len(refused) == 5
    assert all(isinstance(result, RateLimited) for result in refused)
    assert "team_concurrency_limit_exceeded" in {r.code for r in refused}  # type: ignore[attr-defined]
    used, reserved = await store.usage(f"team-concurrency:{shared.id}")
    assert (used, reserved) == (0.0, 5.0)
    # What the team refused took nothing from the keys: their slots add up to the team's.
    slots = [await store.usage(f"concurrency:{k.id}") for k in keys]
    assert sum(reserved for _, reserved in slots) == 5.0
