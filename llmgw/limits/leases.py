"""Capacity leases: a :class:`LimitStore` over a store, that admits one busy key locally.

Every admission on the store is one round trip on the key's shared rows; with many replicas on one
key those rows are the bottleneck (each replica waits for the others' row locks). Here a replica
takes a *slice* of each counter from the store instead (one ordinary store admission of many
requests' worth, under a lease id of its own) and admits from its slices in memory:

- a counter's slices plus its used amount never exceed its cap: they are reservations in the store
  like any other, so the store's all-or-nothing check keeps the cap across replicas;
- a slice starts small and doubles each time it is taken again, up to ``slice_requests`` requests'
  worth; a store refusal divides it by four and asks again, down to exactly what the request lacks,
  so near the cap slices are single units and admission there is as exact as before; the next
  slice is taken in the background when less than half of one is left, or earlier at a busy
  key: when what is left would last less than two recent round trips at the recent admission
  rate of use (never more than two slices early);
- slices live under a lease: a killed replica's unused slices come back when the lease expires
  (``slice_seconds``; renewed while the replica lives). The request window is also a counter here
  (``window:<key>:<seconds>:<start>``): a hit, once admitted, must not come back within its window,
  so what a window slice admitted is reported to the store as *used* every tick (the lease keeps
  the rest) and only the rest comes back when the lease expires;
- usage is pushed to the store in the background (off the request path) every tick: a slice whose
  amount is used up is settled at its amount, a window slice's hits are reported as used, and idle replicas (nothing admitted since the last tick) and
  contended counters (a slice was refused) give their unused slices back; ``close`` gives back
  everything that is not in use;
- fail closed: when a round trip to the store fails, nothing is admitted locally until one works
  again (every admission goes to the store meanwhile, as without slices).

Requests are leases of this module (the policy's lease ids): settling, renewing and cancelling
them is local; the store only sees slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable, Sequence

import attrs

from llmgw.errors import ServiceUnavailable
from llmgw.limits.store import (
    Admission,
    AdmissionResult,
    Charge,
    LimitStore,
    RateLimitDecision,
    Reservation,
    Window,
)

__all__ = ["LeasedLimitStore"]

log = logging.getLogger(__name__)

_WINDOW = "window"
# A quiet key's bare hit is held this much past its window's end: its counter is named after the
# window, so holding it a little longer holds nothing anyone else could use.
_WINDOW_MARGIN_SECONDS = 5.0


def _is_window(counter: str) -> bool:
    return counter.startswith(_WINDOW + ":")


# A store refusal shrinks a counter's slices this much (near the cap they reach single requests).
_SHRINK = 4.0
# A busy counter's next slice is taken at most this many slices early: a slice round trip on a
# busy machine outlasts a whole slice at a thousand admissions a second.
_AHEAD = 2.0


@attrs.define(slots=True)
class _Part:
    """One slice's amount on one counter; usable until ``deadline`` (this process's clock)."""

    amount: float
    deadline: float


@attrs.define(slots=True)
class _Pool:
    """What this replica holds of one counter: ``free = granted - in_use - consumed``."""

    cap: float
    parts: dict[uuid.UUID, _Part] = attrs.field(factory=dict)
    granted: float = 0.0  # the parts' amounts
    earliest: float = math.inf  # the parts' first deadline
    in_use: float = 0.0  # reserved by requests in flight
    consumed: float = 0.0  # used by finished requests, not yet pushed to the store
    size: float = 1.0  # the next slice, in requests' worth
    busy: bool = False  # something was admitted since the last tick
    # Used up since the last tick (a slot given back is not), and a second over the last tick.
    used: float = 0.0
    rate: float = 0.0
    contended: bool = False  # a slice was refused since the last tick

    def add(self, lease_id: uuid.UUID, part: _Part) -> None:
        self.parts[lease_id] = part
        self.granted += part.amount
        self.earliest = min(self.earliest, part.deadline)

    def remove(self, lease_ids: Sequence[uuid.UUID]) -> None:
        """Drop these parts, summed again once for all of them: a tick settles a busy counter's
        used-up slices together, and summing after each was quadratic in them."""
        for lease_id in lease_ids:
            del self.parts[lease_id]
        # Summed again, not subtracted: float sums must not leave a crumb behind.
        self.granted = sum(part.amount for part in self.parts.values()) if self.parts else 0.0
        self.earliest = min((part.deadline for part in self.parts.values()), default=math.inf)

    def shrink(self, lease_id: uuid.UUID, amount: float) -> None:
        """``amount`` of a part was reported used: it is the store's now, no longer this pool's."""
        self.parts[lease_id].amount -= amount
        self.consumed -= amount
        self.granted = sum(part.amount for part in self.parts.values())

    def renewed(self) -> None:
        self.earliest = min((part.deadline for part in self.parts.values()), default=math.inf)

    def free(self, now: float) -> float:
        if now >= self.earliest:
            # The store gave these back (and forgot what of them was used): so does this pool.
            expired = [lease_id for lease_id, part in self.parts.items() if part.deadline <= now]
            for lease_id in expired:
                self.consumed = max(0.0, self.consumed - self.parts[lease_id].amount)
            self.remove(expired)
        return self.granted - self.in_use - self.consumed


@attrs.define(slots=True)
class _Key:
    """A key's admissions on this replica since the last tick, and whether it takes slices."""

    admitted: int = 0
    waited: float = 0.0  # seconds its store round trips took, together
    round_trip: float = 0.0  # the mean of those, when it last had any
    sliced: bool = False


async def _whole(call: Awaitable[None]) -> None:
    """``call``, run to its end even if the caller is cancelled meanwhile (the policy's
    background tasks are, at shutdown): a store call cut off mid-flight can leave its client
    hanging (seen with redis-py)."""
    task = asyncio.ensure_future(call)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    await asyncio.shield(task)


def _low(
    wanted: Sequence[Reservation],
    pools: Sequence[_Pool],
    frees: Sequence[float],
    lead: float,
    *,
    spent: bool = False,
) -> list[Reservation]:
    """The counters of which less is left (``frees``, less what was wanted if ``spent``) than
    half a slice, or than ``lead`` seconds of their recent rate of use (up to ``_AHEAD`` slices:
    near a cap slices shrink, and so does what is held early)."""
    return [
        r
        for r, pool, free in zip(wanted, pools, frees, strict=True)
        if (free - r.amount if spent else free)
        < max(r.amount * pool.size / 2, min(r.amount * pool.size * _AHEAD, pool.rate * lead))
    ]


class LeasedLimitStore:
    def __init__(
        self,
        store: LimitStore,
        *,
        slice_requests: int = 64,
        slice_seconds: float = 10.0,
        tick_seconds: float = 0.25,
        busy_rate: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._busy_rate = busy_rate
        self._keys: dict[Hashable, _Key] = {}
        self._direct: set[uuid.UUID] = set()  # requests the store admitted (quiet keys)
        # Quiet keys' window hits, to be settled as used by the next store round trip; the tick
        # sends them itself only once they have waited a whole tick for one (an idle replica).
        self._hits: list[Charge] = []
        self._hits_since = math.inf  # when the oldest of them was queued
        self._max_size = float(max(1, slice_requests))
        self._slice_seconds = slice_seconds
        self._tick_seconds = tick_seconds
        self._clock = clock
        self._pools: dict[str, _Pool] = {}
        self._requests: dict[uuid.UUID, dict[str, float]] = {}  # what each request holds
        self._cancels: list[tuple[uuid.UUID, tuple[str, ...]]] = []  # slices cut off in flight
        self._unsent: list[Charge] = []  # slices settled here, not yet in the store
        self._using: list[Charge] = []  # window slices' hits, not yet reported used
        self._refilling: dict[tuple[str, ...], asyncio.Lock] = {}
        self._pushing = asyncio.Lock()
        self._down = False
        self._renewed_at = self._ticked_at = clock()
        # The longest slice round trips of this tick and the last; a busy counter's next slice
        # is taken when what is left would last less than ``_lead`` seconds: two of them, so
        # that one longer than the last ones still lands in time. Kept, not computed: every
        # admission reads it.
        self._round_trip = self._last_round_trip = self._lead = 0.0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._prefetches: set[asyncio.Task[None]] = set()
        self._prefetching: set[tuple[str, ...]] = set()  # prefetches under way
        self._starving: dict[tuple[str, ...], int] = {}  # admissions waiting for a refill
        self._closing = False

    # Lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.start()
        self._tasks = [
            asyncio.create_task(self._tick_forever(), name="llmgw-limits-slices"),
            asyncio.create_task(self._push_when_woken(), name="llmgw-limits-slices-push"),
        ]

    async def close(self) -> None:
        """Give back every slice not in use, then close the store."""
        self._closing = True
        self._wake.set()
        # Ended, not cancelled: a store call cut off mid-flight can leave its client hanging
        # (seen with redis-py); each ends within a tick, its calls within the store's time bound.
        await asyncio.gather(*self._tasks, *self._prefetches, return_exceptions=True)
        try:
            await self.push(give_back=True)
        except ServiceUnavailable:
            log.warning("limit slices could not be given back; they expire with their leases")
        await self.store.close()

    async def ping(self) -> None:
        await self.store.ping()

    async def usage(self, counter: str) -> tuple[float, float]:
        """The store's figures: this and other replicas' slices count as reserved."""
        return await self.store.usage(counter)

    # Admission --------------------------------------------------------------------------------

    def _window_reservation(self, window: Window, now: float) -> tuple[Reservation, float]:
        start = math.floor(now / window.seconds) * window.seconds
        name = f"{_WINDOW}:{window.key_id}:{window.seconds}:{start}"
        reset = start + window.seconds - now
        return Reservation(name, window.limit, 1, keep_seconds=window.seconds + 60), reset

    async def hit(self, window: Window) -> RateLimitDecision:
        quiet = self._quiet(window.key_id)
        if quiet is not None:
            result = await self._admit_directly(
                quiet, Admission(uuid.uuid4(), self._slice_seconds, window, ()), ()
            )
            assert result.window is not None
            return result.window
        # From slices, a bare hit takes nothing a request settles: it needs no lease id (a
        # uuid4 is a read of os.urandom) and no admission to carry it.
        decision, _refused = await self._from_slices(None, (), window)
        assert decision is not None
        return decision

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        window = admission.window
        quiet = self._quiet(
            window.key_id
            if window is not None
            else tuple(r.counter for r in admission.reservations)
        )
        if quiet is not None:
            return await self._admit_directly(quiet, admission, settling)
        if settling:
            await self.settle(settling)
        decision, refused = await self._from_slices(
            admission.lease_id, admission.reservations, window
        )
        if decision is not None and not decision.allowed:
            return AdmissionResult(decision)
        return AdmissionResult(decision, refused)

    def _quiet(self, key: Hashable) -> _Key | None:
        """Count an admission of ``key``: its state if the store admits it (a quiet key), None
        if it is admitted from slices."""
        if not self._busy_rate:
            return None
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key()
        state.admitted += 1
        return None if state.sliced else state

    async def _from_slices(
        self,
        lease_id: uuid.UUID | None,
        reservations: Sequence[Reservation],
        window: Window | None,
    ) -> tuple[RateLimitDecision | None, Reservation | None]:
        """Admit from this replica's slices (taking more when they fall short): the window's
        decision, and the reservation the store refused (None: admitted). ``lease_id``: what
        the request settles its reservations by (None: it has none)."""
        now = self._clock()
        wanted = list(reservations)
        reset = 0.0
        if window is not None:
            window_reservation, reset = self._window_reservation(window, now)
            wanted.append(window_reservation)
        refused: Reservation | None = None
        pools, frees, short = self._holding(wanted, now)
        if self._down or short:
            names = tuple(sorted([r.counter for r in wanted]))
            lock = self._refilling.setdefault(names, asyncio.Lock())
            self._starving[names] = self._starving.get(names, 0) + 1
            try:
                async with lock:
                    refused = await self._refill(wanted, names)
            finally:
                self._starving[names] -= 1
                if not self._starving[names]:
                    del self._starving[names]
            # A push meanwhile may have dropped some pools.
            pools, frees, _short = self._holding(wanted, self._clock())
        if refused is None:
            self._take(lease_id, wanted, pools, windowed=window is not None)
            if not self._down and _low(wanted, pools, frees, self._lead, spent=True):
                self._prefetch(wanted)
        if window is None:
            return None, refused
        allowed = refused is None or refused.counter != wanted[-1].counter
        # What the window has left (once this hit took its own).
        left = frees[-1] - wanted[-1].amount if refused is None else frees[-1]
        remaining = max(0, math.floor(left)) if allowed else 0
        return RateLimitDecision(allowed, window.limit, remaining, reset), refused

    async def _admit_directly(
        self, state: _Key, admission: Admission, settling: Sequence[Charge]
    ) -> AdmissionResult:
        """A quiet key's admission: one store round trip, as without slices, carrying what is
        to be settled in the store. Its window is the counter busy keys take slices of (a key
        that turns busy, or quiet again, mid-window is counted in one place on every replica),
        reserved under the request's lease and settled as used with the next round trip (or by
        the tick after a tick without one); the store's figures make its headers exact. The
        time it takes is the key's ``state.waited``."""
        now = self._clock()
        window = admission.window
        reservations = list(admission.reservations)
        window_counter = ""
        reset = 0.0
        if window is not None:
            window_reservation, reset = self._window_reservation(window, now)
            window_counter = window_reservation.counter
            reservations.append(window_reservation)
        if len(reservations) > 1:
            # One locking order (by name) for every store, as the policy's admissions.
            reservations.sort(key=lambda r: r.counter)
        # A bare hit (a key with nothing else to reserve) is held until its window ends: no
        # settlement to send, and none to lose should this replica die. Nobody settles, renews
        # or cancels it (its lease id is this module's own): it is never one of ``_direct``.
        bare = not admission.reservations
        lease_seconds = reset + _WINDOW_MARGIN_SECONDS if bare else admission.lease_seconds
        carried: Sequence[Charge] = settling
        if settling:
            # Told apart before settling: settling a request admitted from slices forgets it,
            # and carried to the store as well it was charged twice.
            local = [c for c in settling if c.lease_id in self._requests]
            if local:
                carried = [c for c in settling if c.lease_id not in self._requests]
                await self.settle(local)
        hits, since = self._take_hits()
        if not bare:
            self._direct.add(admission.lease_id)
        try:
            result = await self.store.admit(
                Admission(admission.lease_id, lease_seconds, None, tuple(reservations)),
                [*carried, *hits],
            )
        except BaseException:
            # Sent again: a hit settled twice refuses early, never late.
            self._keep_hits(hits, since)
            if window_counter:
                # It may still land: its window hit is taken back with the next push.
                self._cancels.append((admission.lease_id, (window_counter,)))
            raise
        finally:
            state.waited += self._clock() - now
        if not result.admitted and not bare:
            self._direct.discard(admission.lease_id)  # nothing for anyone to settle
        if result.cancelled or window is None:
            return result
        if result.refused is not None and result.refused.counter == window_counter:
            return AdmissionResult(RateLimitDecision(False, window.limit, 0, reset))
        remaining = 0
        if result.refused is None:
            if not bare:
                # Used, not reserved: a hit never comes back within its window.
                self._hits.append(Charge(admission.lease_id, window_counter, 1.0))
                self._hits_since = min(self._hits_since, self._clock())
            at = (
                0
                if bare
                else next(i for i, r in enumerate(reservations) if r.counter == window_counter)
            )
            remaining = max(0, math.floor(window.limit - result.taken[at] + 1e-9))
        decision = RateLimitDecision(True, window.limit, remaining, reset)
        return AdmissionResult(decision, result.refused, taken=result.taken)

    def _holding(
        self, wanted: Sequence[Reservation], now: float
    ) -> tuple[list[_Pool], list[float], bool]:
        """The pools of ``wanted``, what each has left, and whether any has less than wanted.
        Looked up and read once, in one loop: this is every admission's path, and a lookup per
        check was a third of its CPU."""
        pools, frees = [], []
        short = False
        for reservation in wanted:
            pool = self._pool(reservation)
            free = pool.free(now)
            pools.append(pool)
            frees.append(free)
            short = short or free < reservation.amount
        return pools, frees, short

    def _pool(self, reservation: Reservation) -> _Pool:
        pool = self._pools.get(reservation.counter)
        if pool is None:
            pool = self._pools[reservation.counter] = _Pool(reservation.cap)
        pool.cap = reservation.cap  # a key's limits may change; its next slice follows
        return pool

    def _take(
        self,
        lease_id: uuid.UUID | None,
        wanted: Sequence[Reservation],
        pools: Sequence[_Pool],
        *,
        windowed: bool,
    ) -> None:
        """Take ``wanted`` from ``pools``; ``windowed``: the last is the window's hit."""
        hit = len(wanted) - 1 if windowed else len(wanted)
        taken = {}
        for at, (reservation, pool) in enumerate(zip(wanted, pools, strict=True)):
            pool.busy = True
            if at == hit:
                pool.consumed += reservation.amount  # a window hit is used once admitted
                pool.used += reservation.amount
            else:
                pool.in_use += reservation.amount
                taken[reservation.counter] = reservation.amount
        if taken and lease_id is not None:
            self._requests[lease_id] = taken

    async def _refill(
        self, wanted: Sequence[Reservation], names: tuple[str, ...]
    ) -> Reservation | None:
        """Take slices until the request fits (None) or the store refuses what it lacks. One
        refill at a time per key (``names``), sized for every admission waiting for one: they
        are served by one round trip instead of one after another."""
        while True:
            now = self._clock()
            short = [r for r in wanted if self._down or self._pool(r).free(now) < r.amount]
            if not short:
                return None
            refused = await self._take_slices(short, wanted, self._starving.get(names, 1))
            if refused is not None:
                return refused

    async def _take_slices(
        self, short: Sequence[Reservation], wanted: Sequence[Reservation], waiting: int = 1
    ) -> Reservation | None:
        """One slice round trip for the ``short`` counters; ``waiting``: admissions waiting for it
        (a grown slice covers them all; near a cap, single units, slices cover one)."""
        now = self._clock()
        slices = []
        for reservation in short:
            pool = self._pool(reservation)
            lacking = max(0.0, reservation.amount - pool.free(now))
            size = min(self._max_size, max(pool.size, waiting)) if pool.size > 1 else 1.0
            whole = reservation.amount * size
            # At a busy key (its next slice is due by its rate, see _low) a whole slice: a top-up
            # taken early is a sliver, as many round trips on the key's shared rows as requests.
            # Otherwise a top-up to one slice: a replica holding a slice and a whole one more
            # starves the others near a cap (a budget worth five worst cases over two gateways
            # admitted four).
            if pool.rate * self._lead <= whole / 2:
                whole -= pool.free(now)
            amount = min(max(lacking, whole), pool.cap)
            slices.append(attrs.evolve(reservation, amount=max(amount, lacking)))
        return await self._take_slice(slices, wanted)

    def _prefetch(self, wanted: Sequence[Reservation]) -> None:
        """Take the next slices in the background before these run out, so that admissions do
        not wait for the round trip (unless one is already under way)."""
        names = tuple(sorted([r.counter for r in wanted]))
        refilling = self._refilling.get(names)
        # One at a time, and none while a refill is under way (it brings what is needed).
        if (refilling is not None and refilling.locked()) or names in self._prefetching:
            return
        self._prefetching.add(names)

        async def prefetching() -> None:
            # Not under the refill lock: an admission that finds nothing left (starving) sends
            # its own slice request at once instead of waiting for this one, which may be
            # refused or fall short (near a cap it only tops up).
            try:
                pools = [self._pool(r) for r in wanted]
                now = self._clock()
                low = _low(wanted, pools, [pool.free(now) for pool in pools], self._lead)
                if low:
                    # Once, not until it is enough: near a cap a refusal only shrinks the next.
                    with contextlib.suppress(ServiceUnavailable):
                        await self._take_slices(low, wanted)
            finally:
                self._prefetching.discard(names)

        task = asyncio.create_task(prefetching(), name="llmgw-limits-slices-prefetch")
        self._prefetches.add(task)
        task.add_done_callback(self._prefetches.discard)

    async def _take_slice(
        self, slices: list[Reservation], wanted: Sequence[Reservation]
    ) -> Reservation | None:
        """One store admission for these slices; the request's refused reservation, if at its
        minimum the store still refuses."""
        lease_id = uuid.uuid4()
        counters = tuple(r.counter for r in slices)
        sent = self._clock()
        try:
            result = await self.store.admit(
                Admission(lease_id, self._slice_seconds, None, tuple(slices))
            )
        except BaseException as exc:
            # Cut off: the store may still grant it, so it is taken back in the background.
            self._cancels.append((lease_id, counters))
            self._wake.set()
            self._down = self._down or isinstance(exc, ServiceUnavailable)
            raise
        self._down = False
        self._round_trip = max(self._round_trip, self._clock() - sent)
        self._lead = 2 * max(self._round_trip, self._last_round_trip)
        assert not result.cancelled  # a fresh lease id is never cancelled
        if result.refused is None:
            for reservation in slices:
                pool = self._pool(reservation)
                pool.add(lease_id, _Part(reservation.amount, sent + self._slice_seconds))
                pool.size = min(self._max_size, pool.size * 2)
            return None
        request = next(r for r in wanted if r.counter == result.refused.counter)
        pool = self._pool(request)
        pool.contended = True
        lacking = request.amount - pool.free(self._clock())
        if result.refused.amount <= lacking or pool.size <= 1:
            pool.size = 1.0
            return request
        pool.size = max(1.0, pool.size / _SHRINK)
        return None

    # Settlement -------------------------------------------------------------------------------

    async def settle(self, charges: Sequence[Charge]) -> None:
        """Settle requests locally; their usage reaches the store with the next tick's push, or
        at once in the background when a counter is contended (other replicas may be waiting
        for what this one gives back)."""
        direct = [c for c in charges if c.lease_id in self._direct]
        contended = False
        for charge in charges:
            if charge.lease_id in self._direct:
                continue
            taken = self._requests.get(charge.lease_id, {})
            amount = taken.pop(charge.counter, 0.0)
            if not taken:
                self._requests.pop(charge.lease_id, None)
            pool = self._pools.get(charge.counter)
            if pool is None:
                continue
            pool.in_use = max(0.0, pool.in_use - amount)
            pool.consumed += charge.actual
            pool.used += charge.actual
            contended = contended or pool.contended
        # Pushed by the background task, not here: the caller's next batch (slots it frees) must
        # not wait for a round trip. Never raises: the policy need not queue these again. Not
        # woken otherwise: a used-up slice holds nothing another replica could use, and a push
        # for each (a statement on the key's shared rows) cost as many round trips as taking
        # the slices.
        if contended:
            self._wake.set()
        if direct:
            # Requests the store admitted (quiet keys): settled there, at once, with the window
            # hits waiting for a round trip; should the store not answer, with the next pushes
            # (never raised: the policy need not queue them).
            self._direct.difference_update(c.lease_id for c in direct)
            hits, since = self._take_hits()
            try:
                await _whole(self.store.settle([*direct, *hits]))
            except BaseException as exc:
                self._keep_hits(hits, since)
                if not isinstance(exc, ServiceUnavailable):
                    raise
                self._unsent.extend(direct)

    def _take_hits(self) -> tuple[list[Charge], float]:
        """The quiet keys' window hits queued, for a round trip to carry, and since when."""
        hits, since = self._hits, self._hits_since
        self._hits, self._hits_since = [], math.inf
        return hits, since

    def _keep_hits(self, hits: list[Charge], since: float) -> None:
        """``hits`` did not reach the store: queued again, in front, as old as they were."""
        self._hits[:0] = hits
        self._hits_since = min(self._hits_since, since)

    async def use(self, charges: Sequence[Charge]) -> None:
        """Use part of what requests took, locally; it reaches the store as their slices' use."""
        for charge in charges:
            taken = self._requests.get(charge.lease_id, {})
            moved = min(taken.get(charge.counter, 0.0), charge.actual)
            if charge.counter in taken:
                taken[charge.counter] -= moved
            pool = self._pools.get(charge.counter)
            if pool is not None:
                pool.in_use = max(0.0, pool.in_use - moved)
                pool.consumed += charge.actual
                pool.used += charge.actual

    async def renew(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        """Requests admitted from slices hold no lease of their own in the store (their slices
        are renewed by the ticks); those the store admitted (quiet keys) do."""
        direct = [lease for lease in leases if lease[0] in self._direct]
        if direct:
            await _whole(self.store.renew(direct, seconds))

    async def cancel(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        """Give back what these requests took locally (an admission is never half done here),
        and cancel in the store those it admitted."""
        direct = [lease for lease in leases if lease[0] in self._direct]
        if direct:
            self._direct.difference_update(lease_id for lease_id, _ in direct)
            await _whole(self.store.cancel(direct, seconds))
        for lease_id, _counters in leases:
            for name, amount in self._requests.pop(lease_id, {}).items():
                pool = self._pools.get(name)
                if pool is not None:
                    pool.in_use = max(0.0, pool.in_use - amount)

    async def push(self, *, give_back: bool = False) -> None:
        """Settle used-up slices at their amount, give back unused slices of idle or contended
        counters (all of them with ``give_back``), report what window slices admitted, and take
        back slices cut off in flight (a round trip for each that has anything to send). Raises
        ServiceUnavailable if the store cannot be reached."""
        async with self._pushing:
            now = self._clock()
            for name, pool in self._pools.items():
                free = pool.free(now)
                returning = give_back or not pool.busy or pool.contended
                gone = []
                for lease_id, part in sorted(pool.parts.items(), key=lambda p: p[1].amount):
                    if pool.consumed >= part.amount:
                        actual = part.amount
                    elif returning and free >= part.amount - pool.consumed:
                        actual = pool.consumed
                        free -= part.amount - pool.consumed
                    else:
                        continue
                    gone.append(lease_id)
                    pool.consumed -= actual
                    self._unsent.append(Charge(lease_id, name, actual))
                if gone:
                    # Gone from the pool before the round trip: nothing is admitted from it.
                    pool.remove(gone)
                if _is_window(name) and pool.consumed > 0 and pool.parts:
                    # Hits are used once admitted: reported, so that should this replica die
                    # the store gives back only the rest of the slice when its lease expires.
                    lease_id = max(pool.parts, key=lambda held: pool.parts[held].amount)
                    hits = min(pool.consumed, pool.parts[lease_id].amount)
                    self._using.append(Charge(lease_id, name, hits))
                    pool.shrink(lease_id, hits)
            cancels, charges, using = self._cancels.copy(), self._unsent.copy(), self._using.copy()
            try:
                if cancels:
                    await self.store.cancel(cancels, self._slice_seconds * 10)
                    del self._cancels[: len(cancels)]
                if using:
                    # Sent again if this fails, as settlements are.
                    await self.store.use(using)
                    del self._using[: len(using)]
                # Not those queued since the last tick: at a steady load the next admission
                # carries them, and a push each tick cost a transaction of its own (issue 29).
                waited = give_back or now - self._hits_since >= self._tick_seconds
                quiet_hits, since = self._take_hits() if waited else ([], math.inf)
                if quiet_hits:
                    try:
                        await self.store.settle(quiet_hits)
                    except BaseException:
                        self._keep_hits(quiet_hits, since)
                        raise
                if charges:
                    # Sent again if this fails: a slice settled twice only charges its use
                    # twice, which refuses a little early but never admits past a cap.
                    await self.store.settle(charges)
                    del self._unsent[: len(charges)]
            except ServiceUnavailable:
                self._down = True
                raise
            self._forget()

    def _forget(self) -> None:
        """Drop counters idle since the last tick with nothing held and nothing to push, and
        unused refill locks."""
        # A busy counter is kept even with nothing held: its slice size is what it learnt, and
        # starting again from a single request's worth after every used-up slice cost a busy key
        # most of its round trips (and its admissions waits for them).
        self._pools = {
            name: pool
            for name, pool in self._pools.items()
            if pool.busy or pool.parts or pool.in_use or pool.consumed > 0
        }
        self._refilling = {names: lock for names, lock in self._refilling.items() if lock.locked()}

    async def tick(self) -> None:
        """What the background task does every ``tick_seconds``: renew slices (a third of their
        lease), push, and start the next period of idleness, contention, admission rate and
        round trips. Each only when there is something to do it to: a replica with only quiet
        keys holds nothing to renew or push, and an idle one has nothing to measure either (a
        tick is then a few checks: its clocks move as a tick's would)."""
        now = self._clock()
        renewing = now - self._renewed_at >= self._slice_seconds / 3
        if (
            self._pools
            or self._refilling
            or self._cancels
            or self._unsent
            or self._using
            or self._hits
        ):
            if renewing:
                await self._renew()
            await self.push()
            now = self._clock()
        elif renewing:
            self._renewed_at = now  # nothing held to renew
        if self._pools or self._keys or self._round_trip or self._last_round_trip:
            seconds = max(now - self._ticked_at, self._tick_seconds)
            for pool in self._pools.values():
                pool.rate = pool.used / seconds
                pool.busy = pool.contended = False
                pool.used = 0.0
            self._sort_keys(seconds)
            self._last_round_trip, self._round_trip = self._round_trip, 0.0
            self._lead = 2 * self._last_round_trip
        self._ticked_at = now

    def _sort_keys(self, seconds: float) -> None:
        """Slices on for the keys busy over the last tick: that admitted at least
        ``busy_rate`` a second, or whose round trips queued (on average more than one in flight
        at once: many replicas on one key's rows each wait for the others, even at a low rate
        each); off again below half of both (a key near the line does not flap). Keys that
        admitted nothing are forgotten; a key turned quiet gives its slices back as any idle
        counter does (the next tick's push)."""
        keys = {}
        for key, state in self._keys.items():
            rate = state.admitted / seconds
            if state.sliced:
                # Its round trips, were it admitted by the store again: as long as the last ones
                # it had, at the rate it has now (a slice makes no round trip per admission).
                state.sliced = rate >= self._busy_rate / 2 or rate * state.round_trip >= 0.5
            else:
                if state.admitted:
                    state.round_trip = state.waited / state.admitted
                state.sliced = rate >= self._busy_rate or state.waited / seconds >= 1.0
            if state.admitted or state.sliced:
                keys[key] = state
            state.admitted, state.waited = 0, 0.0
        self._keys = keys

    async def _renew(self) -> None:
        by_lease: dict[uuid.UUID, list[str]] = {}
        for name, pool in self._pools.items():
            for lease_id in pool.parts:
                by_lease.setdefault(lease_id, []).append(name)
        sent = self._clock()
        if by_lease:
            try:
                await self.store.renew(list(by_lease.items()), self._slice_seconds)
            except ServiceUnavailable:
                self._down = True
                raise
            for lease_id, names in by_lease.items():
                for name in names:
                    holder = self._pools.get(name)
                    if holder is not None and lease_id in holder.parts:
                        holder.parts[lease_id].deadline = sent + self._slice_seconds
                        holder.renewed()
        self._renewed_at = sent

    async def _push_when_woken(self) -> None:
        """Push as soon as settlements arrive (while the store answers: else the ticks retry)."""
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if not self._down and not self._closing:
                with contextlib.suppress(ServiceUnavailable):
                    await self.push()

    async def _tick_forever(self) -> None:
        failing = False  # logged once when it starts failing and once when it works again
        while True:
            await asyncio.sleep(self._tick_seconds)
            if self._closing:
                return
            try:
                await self.tick()
            except ServiceUnavailable:
                if not failing:
                    log.warning("limit slices cannot reach the store; admitting through it")
                failing = True
                continue
            if failing:
                log.warning("limit slices reach the store again")
            failing = False
