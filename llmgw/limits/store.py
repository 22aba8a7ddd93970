"""What every limit store does, and the values that cross its boundary.

A store keeps two kinds of state, shared by every replica:

- request windows: a fixed window per key, counted one request at a time (the store's clock);
- counters: ``used + reserved <= cap``. A request reserves an amount on each counter it falls
  under, all or nothing, under a lease; settling the lease moves the reservation to ``used`` at
  the actual amount. A lease that is neither settled nor renewed expires and its reservation is
  given back, less what was *used* of it meanwhile (capacity leases report a slice's use while they
  hold it, so that a killed replica's slice comes back less what it admitted). An admission whose caller gave up waiting (a stalled store, a timeout) is cancelled
  by its lease id: what it reserved is given back, and should it reach the store only later it is
  refused, so a stall never leaves a lease behind (whichever of the two arrives first).

Counter names say what they count and for which period (``tokens:<key>:<minute>``); the policy makes
them, the store only compares and adds. Every call is one round trip. Stores fail closed: an
unreachable store raises ServiceUnavailable.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Protocol

import attrs

__all__ = [
    "Admission",
    "AdmissionResult",
    "Charge",
    "LimitStore",
    "RateLimitDecision",
    "Reservation",
    "Window",
]


@attrs.frozen(slots=True)
class Window:
    """A key's fixed request window: at most ``limit`` requests per ``seconds``."""

    key_id: uuid.UUID
    limit: int
    seconds: int


@attrs.frozen(slots=True)
class RateLimitDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: float

    @property
    def retry_after(self) -> int:
        """Whole seconds until the window ends, at least 1 (the Retry-After header)."""
        return max(1, math.ceil(self.reset_seconds))

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.limit),
            "x-ratelimit-remaining-requests": str(self.remaining),
            "x-ratelimit-reset-requests": f"{self.retry_after}s",
        }


@attrs.frozen(slots=True)
class Reservation:
    """``amount`` reserved on ``counter`` if ``used + reserved + amount <= cap``.

    ``keep_seconds``: how long the counter outlives its last use (its period, plus a margin).
    """

    counter: str
    cap: float
    amount: float
    keep_seconds: float


@attrs.frozen(slots=True)
class Admission:
    """One request's admission: a window hit (unless already counted) and its reservations."""

    lease_id: uuid.UUID
    lease_seconds: float
    window: Window | None
    reservations: tuple[Reservation, ...]


@attrs.frozen(slots=True)
class AdmissionResult:
    """``window`` is the window decision (None if none was asked); ``refused`` the reservation
    that did not fit (None: admitted). Nothing is counted or reserved unless all of it fits."""

    window: RateLimitDecision | None
    refused: Reservation | None = None
    cancelled: bool = False  # its lease was cancelled before it reached the store
    # Admitted: each reservation's counter, ``used + reserved`` with it (in their order).
    taken: tuple[float, ...] = ()

    @property
    def admitted(self) -> bool:
        return (
            not self.cancelled
            and self.refused is None
            and (self.window is None or self.window.allowed)
        )


@attrs.frozen(slots=True)
class Charge:
    """Settle ``lease_id``'s reservation on ``counter``: give it back, and use ``actual``.

    ``actual`` is charged even when the lease already expired: the usage happened.
    """

    lease_id: uuid.UUID
    counter: str
    actual: float


class LimitStore(Protocol):
    async def hit(self, window: Window) -> RateLimitDecision:
        """Count one request against the window (today's per-request path: nothing reserved)."""
        ...

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        """Settle ``settling`` (as :meth:`settle` would, whatever the admission's outcome), then
        admit, in the same round trip: settlements ride along with admissions instead of costing
        a round trip (a transaction) of their own."""
        ...

    async def settle(self, charges: Sequence[Charge]) -> None:
        """Settle many leases at once (one round trip); settling twice changes nothing more."""
        ...

    async def use(self, charges: Sequence[Charge]) -> None:
        """Move ``actual`` of each lease's reservation to ``used`` and keep the lease with the rest
        (one round trip): when it expires only the rest is given back. ``actual`` is charged even
        when the lease is gone, as :meth:`settle` does; using twice charges twice."""
        ...

    async def renew(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        """Push back the expiry of live leases (lease id, its counters) to ``seconds`` from now."""
        ...

    async def cancel(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        """Give back what these admissions (lease id, its counters) reserved, if they landed, and
        refuse them if they land within ``seconds`` from now; cancelling twice changes nothing."""
        ...

    async def usage(self, counter: str) -> tuple[float, float]:
        """``(used, reserved)`` of a counter, expired leases excluded (tests and reports)."""
        ...

    async def ping(self) -> None:
        """One round trip (readiness); raises ServiceUnavailable when the store cannot be reached."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...
