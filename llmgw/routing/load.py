"""Requests in flight per deployment, summed over every replica (the ``least-busy`` strategy).

Each replica counts its own requests in memory and tells the others what it counts with a
:class:`LoadReport` on the health channel: at most every ``REPORT_INTERVAL_SECONDS``, only when
its counts changed since its last report, and again every ``REFRESH_SECONDS`` while any is not zero
(so that the others' copy does not expire while it stays busy). A report counts for
``TTL_SECONDS`` after it arrives, by the receiver's clock: a replica that dies stops counting within
that, and replicas' clocks need not agree. Reading the sum is a walk over a few dicts in memory:
no store round trip per request.

The same reports say which callers each deployment answered in the last ``SERVED_SECONDS`` (a
short tag per API key, two at most per deployment): a breaker does not let one caller's failures
open a deployment that other callers are being served by on any replica (:mod:`.breaker`). And
whose calls failed in a row on each deployment whose breaker is closed here (:attr:`failing`, set
by the policy, which sends a report at once when it changes): a deployment opens after three
failures on all replicas together.
"""

from __future__ import annotations

import math
import uuid

from llmgw.routing.channel import LoadReport

__all__ = [
    "REFRESH_SECONDS",
    "REPORT_INTERVAL_SECONDS",
    "SERVED_SECONDS",
    "TTL_SECONDS",
    "SharedLoad",
]

REPORT_INTERVAL_SECONDS = 0.25
REFRESH_SECONDS = 1.0
# Three refreshes may be lost before a busy replica's count lapses.
TTL_SECONDS = 3.0
# A report names at most this many deployments (the busiest): it must fit one Postgres NOTIFY
# (8000 bytes) whatever models callers name.
_MAX_REPORTED = 50
# How long a caller a deployment answered counts as being served by it.
SERVED_SECONDS = 30.0
# Callers told per deployment (two tell "another caller than this one"), and deployments named.
_SERVED_CALLERS = 2
_MAX_SERVED = 20
# Replicas whose reports are kept at most (ids are random per process: restarts add new ones,
# and expired ones are forgotten as reports arrive).
_MAX_REPLICAS = 200


class SharedLoad:
    def __init__(self, replica: str | None = None) -> None:
        self.replica = replica or uuid.uuid4().hex
        self.own: dict[str, int] = {}  # provider:model -> requests this replica is serving
        # replica -> (expiry, its report)
        self._others: dict[str, tuple[float, LoadReport]] = {}
        self._served: dict[str, dict[str, float]] = {}  # label -> caller -> when answered, here
        # label -> callers whose calls failed in a row here (the policy keeps it)
        self.failing: dict[str, list[str]] = {}
        self._reported: dict[str, int] = {}
        self._reported_served: dict[str, list[str]] = {}
        self._reported_failing: dict[str, list[str]] = {}
        self._reported_at = -math.inf

    def enter(self, label: str) -> None:
        self.own[label] = self.own.get(label, 0) + 1

    def leave(self, label: str) -> None:
        left = self.own[label] - 1
        if left:
            self.own[label] = left
        else:
            del self.own[label]

    def in_flight(self, label: str, now: float) -> int:
        """This replica's requests on ``label`` plus those the others last reported."""
        count = self.own.get(label, 0)
        for expires, report in self._others.values():
            if expires > now:
                count += report.in_flight.get(label, 0)
        return count

    def served(self, label: str, caller: str, now: float) -> None:
        """``label`` answered ``caller``'s request (``now``: monotonic seconds)."""
        callers = self._served.pop(label, None) or {}  # re-inserted: the newest last
        callers.pop(caller, None)
        callers[caller] = now
        while len(callers) > _SERVED_CALLERS:
            del callers[next(iter(callers))]
        self._served[label] = callers
        while len(self._served) > _MAX_SERVED:
            del self._served[next(iter(self._served))]

    def others_served(self, label: str, caller: str, now: float) -> bool:
        """Whether ``label`` answered a caller other than ``caller`` in the last
        ``SERVED_SECONDS``, here or on a replica that said so."""
        for other, at in self._served.get(label, {}).items():
            if other != caller and now - at < SERVED_SECONDS:
                return True
        return any(
            expires > now and any(other != caller for other in report.served.get(label, ()))
            for expires, report in self._others.values()
        )

    def failing_elsewhere(self, label: str, now: float) -> list[str]:
        """Whose calls to ``label`` failed in a row on the other replicas, as they last said."""
        return [
            caller
            for expires, report in self._others.values()
            if expires > now
            for caller in report.failing.get(label, ())
        ]

    def _served_lately(self, now: float) -> dict[str, list[str]]:
        """Whom each deployment answered in the last ``SERVED_SECONDS`` (older ones forgotten)."""
        for label, callers in list(self._served.items()):
            for caller in [c for c, at in callers.items() if now - at >= SERVED_SECONDS]:
                del callers[caller]
            if not callers:
                del self._served[label]
        return {label: sorted(callers) for label, callers in self._served.items()}

    def report(self, now: float) -> LoadReport | None:
        """What to tell the other replicas now, if anything (``now``: monotonic seconds)."""
        served = self._served_lately(now)
        failing = dict(list(self.failing.items())[-_MAX_SERVED:])
        if (
            self.own == self._reported
            and served == self._reported_served
            and failing == self._reported_failing
            and (not (self.own or served or failing) or now - self._reported_at < REFRESH_SECONDS)
        ):
            return None
        busiest = sorted(self.own.items(), key=lambda item: item[1], reverse=True)
        self._reported, self._reported_served = dict(self.own), served
        self._reported_failing, self._reported_at = failing, now
        return LoadReport(self.replica, dict(busiest[:_MAX_REPORTED]), TTL_SECONDS, served, failing)

    def receive(self, report: LoadReport, now: float) -> None:
        if report.replica == self.replica:
            return
        self._others = {r: held for r, held in self._others.items() if held[0] > now}
        if not (report.in_flight or report.served or report.failing):
            self._others.pop(report.replica, None)
        elif report.replica in self._others or len(self._others) < _MAX_REPLICAS:
            self._others[report.replica] = (now + report.ttl, report)
