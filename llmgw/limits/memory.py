"""An in-process limit store: the reference semantics, for one replica, tests and the policy's
unit tests (with a fake clock). State is lost on restart and not shared between processes."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence

import attrs

from llmgw.limits.store import (
    Admission,
    AdmissionResult,
    Charge,
    RateLimitDecision,
    Reservation,
    Window,
)

__all__ = ["MemoryLimitStore"]


@attrs.define(slots=True)
class _Counter:
    used: float = 0.0
    reserved: float = 0.0
    keep_until: float = 0.0
    leases: dict[uuid.UUID, tuple[float, float]] = attrs.field(
        factory=dict
    )  # id -> (amount, expiry)


class MemoryLimitStore:
    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._windows: dict[tuple[uuid.UUID, int, float], int] = {}
        self._counters: dict[str, _Counter] = {}
        self._cancelled: dict[uuid.UUID, float] = {}  # lease id -> until when it is refused
        self._calls = 0

    def _prune(self, now: float) -> None:
        """Forget ended windows and counters past their period, every so often."""
        self._calls += 1
        if self._calls % 1000:
            return
        self._windows = {s: n for s, n in self._windows.items() if s[2] + s[1] >= now}
        self._counters = {
            name: c for name, c in self._counters.items() if c.keep_until >= now or c.leases
        }
        self._cancelled = {lease: t for lease, t in self._cancelled.items() if t >= now}

    async def start(self) -> None:
        """Nothing to start."""

    async def close(self) -> None:
        """Nothing to release."""

    async def ping(self) -> None:
        """Always reachable: it is this process."""

    def _window(
        self, window: Window, now: float
    ) -> tuple[tuple[uuid.UUID, int, float], int, float]:
        start = math.floor(now / window.seconds) * window.seconds
        slot = (window.key_id, window.seconds, start)
        return slot, self._windows.get(slot, 0), start + window.seconds - now

    async def hit(self, window: Window) -> RateLimitDecision:
        slot, count, reset = self._window(window, self._clock())
        if count >= window.limit:
            return RateLimitDecision(False, window.limit, 0, reset)
        self._windows[slot] = count + 1
        return RateLimitDecision(True, window.limit, window.limit - count - 1, reset)

    def _live(self, name: str, now: float) -> _Counter:
        counter = self._counters.get(name)
        if counter is None or (counter.keep_until < now and not counter.leases):
            counter = self._counters[name] = _Counter()
        for lease_id, (amount, expiry) in list(counter.leases.items()):
            if expiry < now:
                del counter.leases[lease_id]
                counter.reserved = max(0.0, counter.reserved - amount)
        return counter

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        if settling:
            await self.settle(settling)
        now = self._clock()
        self._prune(now)
        if self._cancelled.get(admission.lease_id, -math.inf) >= now:
            return AdmissionResult(None, cancelled=True)
        decision = None
        slot: tuple[uuid.UUID, int, float] | None = None
        if admission.window is not None:
            window = admission.window
            slot, count, reset = self._window(window, now)
            if count >= window.limit:
                return AdmissionResult(RateLimitDecision(False, window.limit, 0, reset))
            decision = RateLimitDecision(True, window.limit, window.limit - count - 1, reset)
        for reservation in admission.reservations:
            counter = self._live(reservation.counter, now)
            if counter.used + counter.reserved + reservation.amount > reservation.cap:
                return AdmissionResult(decision, refused=reservation)
        if slot is not None:
            self._windows[slot] = self._windows.get(slot, 0) + 1
        for reservation in admission.reservations:
            self._reserve(admission, reservation, now)
        taken = tuple(
            self._counters[r.counter].used + self._counters[r.counter].reserved
            for r in admission.reservations
        )
        return AdmissionResult(decision, taken=taken)

    def _reserve(self, admission: Admission, reservation: Reservation, now: float) -> None:
        counter = self._counters[reservation.counter]
        counter.reserved += reservation.amount
        counter.keep_until = max(counter.keep_until, now + reservation.keep_seconds)
        counter.leases[admission.lease_id] = (reservation.amount, now + admission.lease_seconds)

    async def settle(self, charges: Sequence[Charge]) -> None:
        for charge in charges:
            counter = self._counters.get(charge.counter)
            if counter is None:
                continue
            lease = counter.leases.pop(charge.lease_id, None)
            if lease is not None:
                counter.reserved = max(0.0, counter.reserved - lease[0])
            counter.used += charge.actual

    async def use(self, charges: Sequence[Charge]) -> None:
        for charge in charges:
            counter = self._counters.get(charge.counter)
            if counter is None:
                continue
            lease = counter.leases.get(charge.lease_id)
            if lease is not None:
                moved = min(lease[0], charge.actual)
                counter.leases[charge.lease_id] = (lease[0] - moved, lease[1])
                counter.reserved = max(0.0, counter.reserved - moved)
            counter.used += charge.actual

    async def renew(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        expiry = self._clock() + seconds
        for lease_id, counters in leases:
            for name in counters:
                counter = self._counters.get(name)
                if counter is not None and lease_id in counter.leases:
                    counter.leases[lease_id] = (counter.leases[lease_id][0], expiry)

    async def cancel(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        until = self._clock() + seconds
        for lease_id, counters in leases:
            self._cancelled[lease_id] = until
            await self.settle([Charge(lease_id, name, 0.0) for name in counters])

    async def usage(self, counter: str) -> tuple[float, float]:
        live = self._live(counter, self._clock())
        return live.used, live.reserved
