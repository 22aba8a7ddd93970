"""Requests in flight per deployment, summed over every replica (the ``least-busy`` strategy).

Each replica counts its own requests in memory and tells the others what it counts with a
:class:`LoadReport` on the health channel: at most every ``REPORT_INTERVAL_SECONDS``, only when
its counts changed since its last report, and again every ``REFRESH_SECONDS`` while any is not zero
(so that the others' copy does not expire while it stays busy). A report counts for
``TTL_SECONDS`` after it arrives, by the receiver's clock: a replica that dies stops counting within
that, and replicas' clocks need not agree. Reading the sum is a walk over a few dicts in memory:
no store round trip per request.
"""

from __future__ import annotations

import math
import uuid

from llmgw.routing.channel import LoadReport

__all__ = ["REFRESH_SECONDS", "REPORT_INTERVAL_SECONDS", "TTL_SECONDS", "SharedLoad"]

REPORT_INTERVAL_SECONDS = 0.25
REFRESH_SECONDS = 1.0
# Three refreshes may be lost before a busy replica's count lapses.
TTL_SECONDS = 3.0
# A report names at most this many deployments (the busiest): it must fit one Postgres NOTIFY
# (8000 bytes) whatever models callers name.
_MAX_REPORTED = 50
# Replicas whose reports are kept at most (ids are random per process: restarts add new ones,
# and expired ones are forgotten as reports arrive).
_MAX_REPLICAS = 200


class SharedLoad:
    def __init__(self, replica: str | None = None) -> None:
        self.replica = replica or uuid.uuid4().hex
        self.own: dict[str, int] = {}  # provider:model -> requests this replica is serving
        self._others: dict[str, tuple[float, dict[str, int]]] = {}  # replica -> (expiry, counts)
        self._reported: dict[str, int] = {}
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
        for expires, counts in self._others.values():
            if expires > now:
                count += counts.get(label, 0)
        return count

    def report(self, now: float) -> LoadReport | None:
        """What to tell the other replicas now, if anything (``now``: monotonic seconds)."""
        if self.own == self._reported and (
            not self.own or now - self._reported_at < REFRESH_SECONDS
        ):
            return None
        busiest = sorted(self.own.items(), key=lambda item: item[1], reverse=True)
        self._reported, self._reported_at = dict(self.own), now
        return LoadReport(self.replica, dict(busiest[:_MAX_REPORTED]), TTL_SECONDS)

    def receive(self, report: LoadReport, now: float) -> None:
        if report.replica == self.replica:
            return
        self._others = {r: held for r, held in self._others.items() if held[0] > now}
        if not report.in_flight:
            self._others.pop(report.replica, None)
        elif report.replica in self._others or len(self._others) < _MAX_REPLICAS:
            self._others[report.replica] = (now + report.ttl, report.in_flight)
