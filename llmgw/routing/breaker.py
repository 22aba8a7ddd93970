"""One deployment's circuit breaker: closed, open, or half-open (one probe at a time).

Pure state, no clock of its own: every call is given ``now`` (wall-clock seconds, because an open
breaker's end is shared with other replicas). A few consecutive failed calls open it for the
cooldown. Once the cooldown has passed it is half-open: one request (the probe) is let through; its
success closes the breaker, its failure opens it again for the cooldown, so that a deployment that
recovers carries traffic again within a cooldown. Only after more failed probes in a row than the
operator allows (``Cooldown.steady_probes``) does the cooldown double with each further one. A
429's ``Retry-After`` opens it for that long. No opening outlasts ``Cooldown.most``: an upstream (or
a caller that makes it say so) cannot take a deployment away for a day.

Failures count across replicas: each replica tells the others whose calls failed in a row there
(``elsewhere``, :mod:`.load`), so a deployment that is down gets three attempts in all, not three
per replica, before it opens.

One caller cannot open it for everyone: while every failure in a row is one caller's and another
caller was answered by the deployment a moment ago (``others_served``, which the policy knows across
replicas), the failures are that caller's requests, not the deployment, and it stays closed. A
deployment only one caller uses opens as before.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from llmgw.config.providers_file import Cooldown

__all__ = ["FAILURES_TO_OPEN", "Breaker", "State"]

# Consecutive failed calls that open a closed breaker: one failure is noise, three in a row with
# nothing in between is a deployment that is down.
FAILURES_TO_OPEN = 3


class State(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@attrs.define(slots=True)
class Breaker:
    failures: int = 0  # consecutive failed calls since the last success
    # Whose the last of them were ("" for a request without a key), oldest first
    failed_by: list[str] = attrs.field(factory=list)
    open_until: float | None = None  # None: closed
    openings: int = 0  # times opened since it last closed: 1 + the failed probes in a row
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
        self.failed_by = []
        self.probing = False
        if self.open_until is None:
            return False
        self.open_until, self.openings, self.changed_at = None, 0, now
        return True

    def failed(
        self,
        now: float,
        cooldown: Cooldown,
        *,
        retry_after: float | None = None,
        probe: bool = False,
        caller: str = "",
        others_served: bool = False,
        elsewhere: Sequence[str] = (),
    ) -> bool:
        """A call of ``caller``'s failed; returns whether the breaker opened (or for longer).

        ``others_served``: another caller was answered by the deployment a moment ago;
        ``elsewhere``: whose calls failed in a row on the other replicas."""
        self.failures += 1
        self.last_failure_at = now
        self.probing = False
        self.failed_by = [*self.failed_by, caller][-FAILURES_TO_OPEN:]
        if others_served and {*elsewhere, *self.failed_by} == {caller}:
            return False  # this caller's requests fail, not the deployment
        if retry_after is not None:
            # The provider said how long: believed up to the longest opening, and never shorter
            # than what is already known.
            return self._open(now, min(max(retry_after, 0.0), cooldown.most), count=False)
        state = self.state(now)
        if state is State.OPEN:
            return False  # a call sent before it opened; the cooldown already runs
        if probe or state is State.HALF_OPEN or self.failures + len(elsewhere) >= FAILURES_TO_OPEN:
            return self._open(now, cooldown.after(self.openings), count=True)
        return False

    def _open(self, now: float, seconds: float, *, count: bool) -> bool:
        until = now + seconds
        if self.open_until is not None and until <= self.open_until:
            return False
        self.open_until, self.changed_at = until, now
        if count:
            self.openings += 1
        return True
