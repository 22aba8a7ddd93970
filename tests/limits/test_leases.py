"""Capacity leases over the in-memory store with a fake clock: no database, no network.

Several :class:`LeasedLimitStore` over one store stand for replicas sharing it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest

from llmgw.errors import ServiceUnavailable
from llmgw.limits.leases import LeasedLimitStore
from llmgw.limits.memory import MemoryLimitStore
from llmgw.limits.store import Admission, AdmissionResult, Charge, Reservation, Window
from tests.limits.test_policy import Clock

LEASE = 10.0


def replica(store: MemoryLimitStore, clock: Clock, slice_requests: int = 64) -> LeasedLimitStore:
    return LeasedLimitStore(store, slice_requests=slice_requests, slice_seconds=LEASE, clock=clock)


def request(*reservations: Reservation, window: Window | None = None) -> Admission:
    return Admission(uuid.uuid4(), 60.0, window, reservations)


def tokens(counter: str, cap: float, amount: float = 1.0) -> Reservation:
    return Reservation(counter, cap, amount, keep_seconds=120)


async def admitted(leased: LeasedLimitStore, *reservations: Reservation) -> int:
    count = 0
    for _ in range(1000):
        count += (await leased.admit(request(*reservations))).admitted
    return count


async def test_one_replica_admits_exactly_the_cap_through_growing_slices() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    leased = replica(store, clock)
    assert await admitted(leased, tokens("tokens:k:0", 100.0)) == 100
    assert await store.usage("tokens:k:0") == (0.0, 100.0)  # all of it in this replica's slices


async def test_replicas_never_exceed_the_cap_and_take_single_units_near_it() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    replicas = [replica(store, clock) for _ in range(4)]
    counter = tokens("tokens:k:0", 50.0)
    results = await asyncio.gather(*(admitted(r, counter) for r in replicas))
    assert sum(results) <= 50
    used, reserved = await store.usage(counter.counter)
    assert used + reserved <= 50.0
    # What one replica holds unused it gives back when it is idle (a tick with nothing admitted):
    # then the others take all of it, one unit at a time.
    for r in replicas:
        await r.tick()  # busy since the last tick: the unused part stays
        await r.tick()  # idle: given back
    assert sum(results) + sum(await asyncio.gather(*(admitted(r, counter) for r in replicas))) == 50


async def test_a_refused_slice_shrinks_down_to_what_the_request_lacks() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    big, small = replica(store, clock), replica(store, clock)
    counter = tokens("tokens:k:0", 100.0)
    for _ in range(40):  # its slices grew to 1 + 2 + ... + 32 = 63, the next would be 64
        assert (await big.admit(request(counter))).admitted
    assert (await small.admit(request(counter))).admitted  # it holds 1
    # 36 are left in the store: a 64 is refused, then smaller slices take all of them, and no
    # request is refused before they are all used.
    more = 0
    while (await big.admit(request(counter))).admitted:
        more += 1
    assert 40 + more == 99


async def test_concurrency_slots_come_back_when_requests_settle() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    leased = replica(store, clock)
    slot = Reservation("concurrency:k", 3.0, 1.0, keep_seconds=120)
    held = [request(slot) for _ in range(4)]
    results = [await leased.admit(h) for h in held]
    assert [r.admitted for r in results] == [True, True, True, False]
    assert results[-1].refused == slot
    await leased.settle([Charge(held[0].lease_id, slot.counter, 0.0)])
    assert (await leased.admit(request(slot))).admitted
    assert not (await leased.admit(request(slot))).admitted


async def test_usage_reaches_the_store_and_unused_slices_go_back_on_close() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    leased = replica(store, clock)
    counter = tokens("tokens:k:0", 1000.0, 10.0)
    held = [request(counter) for _ in range(20)]
    for h in held:
        assert (await leased.admit(h)).admitted
    await leased.settle([Charge(h.lease_id, counter.counter, 4.0) for h in held])
    await leased.close()
    assert await store.usage(counter.counter) == (80.0, 0.0)


async def test_a_window_admits_exactly_its_limit_and_hits_are_not_given_back() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    window = Window(uuid.uuid4(), limit=10, seconds=60)
    first, second = replica(store, clock), replica(store, clock)
    decisions = [await first.hit(window) for _ in range(7)]
    assert all(d.allowed for d in decisions)
    await first.close()
    decisions = [await second.hit(window) for _ in range(5)]
    assert [d.allowed for d in decisions] == [True] * 3 + [False] * 2
    assert decisions[-1].remaining == 0
    assert 0 < decisions[-1].reset_seconds <= 60


async def test_a_killed_replicas_slice_comes_back_after_its_lease_never_twice() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    killed, survivor = replica(store, clock), replica(store, clock)
    slot = Reservation("concurrency:k", 8.0, 1.0, keep_seconds=120)
    for _ in range(4):
        assert (await killed.admit(request(slot))).admitted  # and never settled: it is killed
    _used, reserved = await store.usage(slot.counter)
    assert reserved > 4  # it took more than it used
    assert await admitted(survivor, slot) == 8 - reserved
    clock.now += LEASE + 0.1
    assert await admitted(survivor, slot) == reserved  # its whole slice, not more


async def test_a_killed_replicas_window_hits_stay_counted_and_its_unused_slice_comes_back() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    window = Window(uuid.uuid4(), limit=10, seconds=60)
    killed, survivor = replica(store, clock), replica(store, clock)
    for _ in range(4):
        assert (await killed.hit(window)).allowed
    await killed.push()  # its tick reports the 4 hits used; then it is killed, holding the rest
    [counter] = [name for name in store._counters if name.startswith("window:")]
    used, held = await store.usage(counter)
    assert (used, held > 0) == (4, True)
    assert sum([(await survivor.hit(window)).allowed for _ in range(10)]) == 6 - held
    await survivor.push()  # its own hits too (it lives: its ticks report them)
    clock.now += LEASE + 0.1  # a lease later, still the same window
    assert sum([(await survivor.hit(window)).allowed for _ in range(10)]) == held  # not 0
    clock.now += 60  # the next window
    assert sum([(await survivor.hit(window)).allowed for _ in range(12)]) == 10


async def test_a_refusal_takes_nothing_and_names_what_did_not_fit() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    leased = replica(store, clock)
    window = Window(uuid.uuid4(), limit=1, seconds=60)
    fits, too_big = tokens("c:fits", 5.0), tokens("c:big", 0.5)
    result = await leased.admit(request(fits, too_big, window=window))
    assert result.refused == too_big
    assert result.window is not None and result.window.allowed
    assert (await leased.hit(window)).allowed  # the refused request took no place in the window
    assert not (await leased.hit(window)).allowed


class _Down(MemoryLimitStore):
    down = False

    async def admit(self, admission: Admission) -> AdmissionResult:
        if self.down:
            raise ServiceUnavailable("the store is down")
        return await super().admit(admission)

    async def settle(self, charges: list[Charge]) -> None:  # type: ignore[override]
        if self.down:
            raise ServiceUnavailable("the store is down")
        await super().settle(charges)


async def test_it_fails_closed_once_the_store_is_down_and_recovers() -> None:
    clock = Clock()
    store = _Down(clock=clock)
    leased = replica(store, clock)
    counter = tokens("tokens:k:0", 1000.0)
    held = [request(counter) for _ in range(10)]
    for h in held:
        assert (await leased.admit(h)).admitted  # slices are held now
    store.down = True
    await leased.settle([Charge(h.lease_id, counter.counter, 1.0) for h in held[:5]])
    with pytest.raises(ServiceUnavailable):
        await leased.push()  # what the background task does after a settlement
    with pytest.raises(ServiceUnavailable):
        await leased.admit(request(counter))  # the push found it down: nothing from the slices
    store.down = False
    held.append(request(counter))
    assert (await leased.admit(held[-1])).admitted
    await leased.settle([Charge(h.lease_id, counter.counter, 1.0) for h in held[5:]])
    await leased.close()
    assert await store.usage(counter.counter) == (11.0, 0.0)  # what failed was sent again


async def test_a_cancelled_request_gives_back_what_it_took() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    leased = replica(store, clock)
    slot = Reservation("concurrency:k", 1.0, 1.0, keep_seconds=120)
    landed = request(slot)
    assert (await leased.admit(landed)).admitted
    await leased.cancel([(landed.lease_id, (slot.counter,))], 60.0)
    await leased.cancel([(landed.lease_id, (slot.counter,))], 60.0)  # twice: nothing more
    assert (await leased.admit(request(slot))).admitted
    assert not (await leased.admit(request(slot))).admitted


class _Distant(MemoryLimitStore):
    """A store whose answers take ``ROUND_TRIP`` seconds of the test's clock; it notes how much
    of the slices it granted the replica had left when it asked for the next one."""

    ROUND_TRIP = 0.04

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.clock = clock
        self.granted = 0.0
        self.used = 0.0  # moved by the test
        self.left_when_asked: list[float] = []
        self._moved = asyncio.Event()

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self._moved.set()  # wakes the answers under way, which wait again on a fresh one
        self._moved = asyncio.Event()

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        self.left_when_asked.append(self.granted - self.used)
        sent = self.clock.now
        while self.clock.now < sent + self.ROUND_TRIP:
            await self._moved.wait()
        result = await super().admit(admission, settling)
        if result.admitted:
            self.granted += sum(r.amount for r in admission.reservations)
        return result


async def waits_at(rate: float, store: _Distant, clock: Clock) -> int:
    """Admit ``rate`` a second for 3 s (each request used up at once, a tick every 0.25 s): the
    admissions of the last 2 s that waited for a slice."""
    leased = replica(store, clock)
    counter = tokens("tokens:k:0", 1e9)
    waits = 0
    ticked = clock.now
    for n in range(int(3 * rate)):
        store.advance(1 / rate)
        if clock.now - ticked >= 0.25:
            await leased.tick()
            ticked = clock.now
        admission = request(counter)
        task = asyncio.ensure_future(leased.admit(admission))
        await asyncio.sleep(0)  # an admission from a slice is done in one step
        waits += not task.done() and n >= rate
        while not task.done():
            store.advance(0.001)
            await asyncio.sleep(0)
        assert task.result().admitted
        store.used += 1
        await leased.settle([Charge(admission.lease_id, counter.counter, 1.0)])
    return waits


async def test_a_busy_key_takes_its_next_slice_two_round_trips_ahead() -> None:
    clock = Clock()
    store = _Distant(clock)
    # 1,000 a second use half a 64-request slice in 32 ms, less than the 40 ms round trip: a
    # prefetch at half a slice would leave admissions waiting for every slice.
    assert await waits_at(1000.0, store, clock) == 0
    late = store.left_when_asked[len(store.left_when_asked) // 2 :]
    # Two round trips at 1,000 a second: about 80 (at most two slices).
    assert min(late) >= 64 and max(late) <= 82


async def test_a_quiet_key_takes_its_next_slice_at_half_a_slice_left() -> None:
    clock = Clock()
    store = _Distant(clock)
    assert await waits_at(50.0, store, clock) == 0
    late = store.left_when_asked[len(store.left_when_asked) // 2 :]
    # Two round trips at 50 a second are 4 requests: half a slice (32) comes first.
    assert late and max(late) < 32


class _GatedStore(MemoryLimitStore):
    """A memory store whose admissions wait at a gate while it is closed; counts them in flight."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = self.most_in_flight = 0

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            return await super().admit(admission, settling)
        finally:
            self.in_flight -= 1


async def test_a_starving_key_does_not_wait_behind_a_slice_request_under_way() -> None:
    clock = Clock()
    store = _GatedStore(clock)
    leased = replica(store, clock)
    counter = tokens("tokens:k:0", 1000.0)
    for _ in range(7):  # slices of 1, 2 and 4: all used, the next one (8) is being fetched ahead
        assert (await leased.admit(request(counter))).admitted
    store.gate.clear()  # the store stalls: the prefetch under way does not come back
    await asyncio.sleep(0)
    assert store.in_flight == 1
    starving = [asyncio.create_task(leased.admit(request(counter))) for _ in range(20)]
    await asyncio.sleep(0.01)
    # One slice request of their own, sized for all of them, not one after the other behind it.
    assert store.in_flight == 2
    store.gate.set()
    assert all(result.admitted for result in await asyncio.gather(*starving))
    assert store.most_in_flight == 2
    await leased.close()


# Leases that turn themselves on (``busy_rate``): quiet keys are admitted by the store.

BUSY = 200.0


def auto_replica(store: MemoryLimitStore, clock: Clock) -> LeasedLimitStore:
    return LeasedLimitStore(store, slice_seconds=LEASE, busy_rate=BUSY, clock=clock)


async def test_a_quiet_keys_requests_are_each_counted_by_the_store_with_exact_headers() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    replicas = [auto_replica(store, clock) for _ in range(2)]
    window = Window(uuid.uuid4(), limit=5, seconds=60)
    decisions = [await replicas[i % 2].hit(window) for i in range(7)]
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0, 0]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    # Slots too: each request reserves in the store, and its settlement reaches it.
    slot = Reservation("concurrency:q", 2.0, 1.0, keep_seconds=120)
    held = [request(slot, window=Window(uuid.uuid4(), 100, 60)) for _ in range(3)]
    results = [await replicas[i % 2].admit(h) for i, h in enumerate(held)]
    assert [r.admitted for r in results] == [True, True, False]
    assert await store.usage(slot.counter) == (0.0, 2.0)
    await replicas[0].settle([Charge(held[0].lease_id, slot.counter, 0.0)])
    assert await store.usage(slot.counter) == (0.0, 1.0)
    for leased in replicas:
        await leased.tick()
    _used, reserved = await store.usage(slot.counter)
    assert reserved == 1.0  # a quiet key takes no slice


async def test_a_key_turning_busy_mid_window_takes_slices_and_keeps_its_window_exact() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    first, second = auto_replica(store, clock), auto_replica(store, clock)
    window = Window(uuid.uuid4(), limit=300, seconds=60)
    quiet = sum([(await first.hit(window)).allowed for _ in range(100)])  # one by one
    clock.now += 0.25
    await first.tick()  # 100 in a tick: 400 a second, busy
    await second.tick()
    [counter] = [name for name in store._counters if name.startswith("window:")]
    # Each hit in the store, held until the window ends (a bare hit: nothing to settle).
    assert await store.usage(counter) == (0.0, 100.0)
    busy = sum([(await first.hit(window)).allowed for _ in range(150)])
    used, reserved = await store.usage(counter)
    assert used + reserved > 100 + busy  # a slice, held ahead
    later = sum([(await second.hit(window)).allowed for _ in range(300)])  # still quiet there
    assert quiet + busy + later <= 300  # one window, counted in one place
    for _ in range(2):
        clock.now += 0.25
        await first.tick()  # busy, then idle: its unused slice goes back
    later += sum([(await second.hit(window)).allowed for _ in range(300)])
    assert quiet + busy + later == 300


async def test_a_quiet_keys_admission_cut_off_gives_its_window_hit_back() -> None:
    clock = Clock()
    store = _GatedStore(clock)
    leased = auto_replica(store, clock)
    window = Window(uuid.uuid4(), limit=1, seconds=60)
    store.gate.clear()
    stalled = asyncio.create_task(leased.hit(window))
    await asyncio.sleep(0)
    stalled.cancel()
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await stalled
    await leased.push()  # the cut-off admission is cancelled in the store
    assert (await leased.hit(window)).allowed


async def test_a_key_whose_round_trips_queue_takes_slices_even_at_a_low_rate() -> None:
    """Many replicas on one key's rows: each waits for the others, and admits little itself."""
    clock = Clock()

    class Queued(MemoryLimitStore):
        calls = 0

        async def admit(
            self, admission: Admission, settling: Sequence[Charge] = ()
        ) -> AdmissionResult:
            self.calls += 1
            await asyncio.sleep(0)  # sent together ...
            clock.now += 0.1  # ... each waits behind the one before (and other replicas')
            return await super().admit(admission, settling)

    store = Queued(clock=clock)
    leased = auto_replica(store, clock)
    window = Window(uuid.uuid4(), limit=1000, seconds=60)
    # Three at once, answered 0.1, 0.2 and 0.3 s later: two in flight on average.
    assert all(d.allowed for d in await asyncio.gather(*(leased.hit(window) for _ in range(3))))
    await leased.tick()
    store.calls = 0
    for _ in range(15):
        assert (await leased.hit(window)).allowed
    assert store.calls <= 7  # slices (1, 2, 4, 8 and ahead), not a round trip each
    quiet = auto_replica(store, clock)  # the same rate without queueing stays quiet
    other = Window(uuid.uuid4(), limit=1000, seconds=60)
    for _ in range(3):
        assert (await quiet.hit(other)).allowed
        clock.now += 0.1
    await quiet.tick()
    assert (await quiet.hit(other)).remaining == 996  # the store's count: not sliced


async def test_a_killed_replicas_quiet_hits_stay_counted_in_their_window() -> None:
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    killed, survivor = auto_replica(store, clock), auto_replica(store, clock)
    window = Window(uuid.uuid4(), limit=10, seconds=60)
    for _ in range(3):
        assert (await killed.hit(window)).allowed  # then it is killed: nothing more is sent
    clock.now += LEASE + 0.1  # a lease later, still the same window
    assert sum([(await survivor.hit(window)).allowed for _ in range(10)]) == 7


class _CountedSettlements(MemoryLimitStore):
    """A memory store that counts the settlements sent as round trips of their own (not those
    that ride along with an admission)."""

    settled = 0

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        settled = self.settled
        try:
            return await super().admit(admission, settling)
        finally:
            self.settled = settled

    async def settle(self, charges: Sequence[Charge]) -> None:
        self.settled += 1
        await super().settle(charges)


async def test_a_quiet_keys_window_hits_ride_with_its_admissions_not_with_the_ticks() -> None:
    """Issue 29: at a steady load each hit is settled as used by the next admission's round
    trip, never by a tick's push of its own (it cost a transaction four times a second); an
    idle replica's last hit reaches the store once it has waited a whole tick for a ride."""
    clock = Clock()
    store = _CountedSettlements(clock=clock)
    leased = auto_replica(store, clock)
    window = Window(uuid.uuid4(), limit=1000, seconds=60)
    slot = Reservation("concurrency:steady", 2.0, 1.0, keep_seconds=120)
    ended: list[Charge] = []
    for _ in range(8):
        for _ in range(10):  # 40 a second, each settling the one before (as the policy does)
            admission = request(slot, window=window)
            assert (await leased.admit(admission, ended)).admitted
            ended = [Charge(admission.lease_id, slot.counter, 0.0)]
            clock.now += 0.025
        await leased.tick()
    assert store.settled == 0
    [counter] = [name for name in store._counters if name.startswith("window:")]
    assert await store.usage(counter) == (79.0, 1.0)  # the last hit waits for a ride
    clock.now += 0.25
    await leased.tick()  # it waited a whole tick: it goes by itself
    assert store.settled == 1
    assert await store.usage(counter) == (80.0, 0.0)
    # The last request's own settlement takes the next hit with it: one round trip for both.
    last = request(slot, window=window)
    clock.now += 0.025
    assert (await leased.admit(last, ended)).admitted
    await leased.settle([Charge(last.lease_id, slot.counter, 0.0)])
    assert store.settled == 2
    assert await store.usage(counter) == (81.0, 0.0)
    assert await store.usage(slot.counter) == (0.0, 0.0)


async def test_a_request_admitted_from_a_slice_is_charged_once_when_its_key_turned_quiet() -> None:
    """Its settlement rides with the key's next admission, by the store: it is settled here, on
    its slice (which the store is charged for once it is settled), and not carried as well."""
    clock = Clock()
    store = MemoryLimitStore(clock=clock)
    leased = auto_replica(store, clock)
    window = Window(uuid.uuid4(), limit=10_000, seconds=60)
    budget = tokens("tokens:quiet-again", 1_000_000, 10.0)
    for _ in range(100):  # quiet: each admitted by the store, and settled at nothing
        warming = request(budget, window=window)
        assert (await leased.admit(warming)).admitted
        await leased.settle([Charge(warming.lease_id, budget.counter, 0.0)])
    clock.now += 0.25
    await leased.tick()  # 400 a second: busy
    sliced = request(budget, window=window)
    assert (await leased.admit(sliced)).admitted  # from a slice
    clock.now += 0.25
    await leased.tick()  # one admission in a tick: quiet again
    later = request(budget, window=window)
    used = [Charge(sliced.lease_id, budget.counter, 3.0)]
    assert (await leased.admit(later, used)).admitted  # by the store, carrying the settlement
    await leased.settle([Charge(later.lease_id, budget.counter, 0.0)])
    for _ in range(2):
        clock.now += 0.25
        await leased.tick()  # the slice, idle, is settled at what it admitted
    assert await store.usage(budget.counter) == (3.0, 0.0)
