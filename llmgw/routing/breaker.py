"""One deployment's circuit breaker: closed, open, or half-open (one probe at a time).

Pure state, no clock of its own: every call is given ``now`` (wall-clock seconds, because an open
breaker's end is shared with other replicas). A few consecutive failed calls open it for the
cooldown; each time it opens again without having closed, the cooldown doubles, up to a cap. Once
the cooldown has passed it is half-open: one request (the probe) is let through; its success closes
the breaker, its failure opens it again. A 429's ``Retry-After`` opens it for exactly that long.
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["FAILURES_TO_OPEN", "MAX_COOLDOWN_SECONDS", "Breaker", "State"]

# Consecutive failed calls (each after its own retries) that open a closed breaker: one failure is
# noise, three in a row with nothing in between is a deployment that is down.
FAILURES_TO_OPEN = 3
# The doubling stops here (or at the deployment's own cooldown, when that is longer): a deployment
# down for an hour is still probed every five minutes.
MAX_COOLDOWN_SECONDS = 300.0


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@attrs.define(slots=True)
class Breaker:
    failures: int = 0  # consecutive failed calls since the last success
    open_until: float | None = None  # None: closed
    openings: int = 0  # times opened since it last closed (the cooldown doubles with each)
    last_failure_at: float = 0.0
    probing: bool = False  # a probe is in flight (on this replica)
    changed_at: float = 0.0  # when open_until last changed: the newer of two replicas' views wins

    def state(self, now: float) -> State:
        if self.open_until is None:
            return State.CLOSED
        return State.OPEN if now < self.open_until else State.HALF_OPEN

    def take_probe(self, now: float) -> bool:
        """Whether this request may be the half-open breaker's probe (it then holds the slot)."""
        if self.state(now) is not State.HALF_OPEN or self.probing:
            return False
        self.probing = True
        return True

    def release_probe(self) -> None:
        """The probe ended without telling how the deployment is (the caller left)."""
        self.probing = False

    def succeeded(self, now: float) -> bool:
        """A call was answered; returns whether the breaker closed (a change to share)."""
        self.failures = 0
        self.probing = False
        if self.open_until is None:
            return False
        self.open_until, self.openings, self.changed_at = None, 0, now
        return True

    def failed(
        self, now: float, *, cooldown: float, retry_after: float | None = None, probe: bool = False
    ) -> bool:
        """A call failed; returns whether the breaker opened (or opened for longer)."""
        self.failures += 1
        self.last_failure_at = now
        self.probing = False
        if retry_after is not None:
            # The provider said how long: believed, but never shorter than what is already known.
            return self._open(now, max(retry_after, 0.0), count=False)
        state = self.state(now)
        if state is State.OPEN:
            return False  # a call sent before it opened; the cooldown already runs
        if probe or state is State.HALF_OPEN or self.failures >= FAILURES_TO_OPEN:
            cap = max(cooldown, MAX_COOLDOWN_SECONDS)
            return self._open(now, min(cap, cooldown * 2**self.openings), count=True)
        return False

    def _open(self, now: float, seconds: float, *, count: bool) -> bool:
        until = now + seconds
        if self.open_until is not None and until <= self.open_until:
            return False
        self.open_until, self.changed_at = until, now
        if count:
            self.openings += 1
        return True
