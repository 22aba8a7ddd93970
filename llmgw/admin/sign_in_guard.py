"""Failed admin sign-ins (console and admin API), throttled per client address and logged.

Each address has a token bucket of attempts: ``burst`` wrong tokens at once, then one more every
``refill_seconds``. Only failures take from it, so an operator who types the token right is never
slowed; while it is empty every attempt from that address is refused with a 429 and Retry-After,
before the token is even compared, so guessing runs at the refill rate at most.

Every failure is a WARNING line (address and route; never what was presented). Refusals while
throttled are counted and logged at most once per ``report_seconds`` per address with their
count, so a storm of thousands makes a few lines, not thousands. The state is per process: each
worker and replica throttles the addresses it sees.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import attrs
from aiohttp import web

from llmgw.errors import RateLimited
from llmgw.forwarded import client_address

__all__ = ["SignInGuard", "SignInThrottle"]

log = logging.getLogger(__name__)


@attrs.define
class _Bucket:
    attempts: float
    updated: float
    refused: int = 0  # refusals while throttled, not yet in a log line
    reported_at: float | None = None  # when the last throttled line for this address was written


class SignInThrottle:
    def __init__(
        self,
        *,
        burst: int = 10,
        refill_seconds: float = 6.0,
        report_seconds: float = 10.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._refill_seconds = refill_seconds
        self._report_seconds = report_seconds
        self._max_addresses = max_addresses
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, address: str, route: str) -> None:
        """Raise a 429 while ``address`` has no attempts left (logged, aggregated)."""
        bucket = self._buckets.get(address)
        if bucket is None:
            return
        now = self._refill(bucket)
        if bucket.attempts >= 1:
            return
        wait = math.ceil((1 - bucket.attempts) * self._refill_seconds)
        bucket.refused += 1
        if bucket.reported_at is None or now - bucket.reported_at >= self._report_seconds:
            log.warning(
                "admin sign-ins throttled",
                extra={
                    "client_address": address,
                    "route": route,
                    "refused": bucket.refused,  # since the previous line for this address
                    "retry_after_seconds": wait,
                },
            )
            bucket.refused, bucket.reported_at = 0, now
        raise RateLimited(
            f"Too many failed admin sign-ins from this address; try again in {wait} s.",
            code="sign_in_throttled",
            headers={"Retry-After": str(wait)},
        )

    def failed(self, address: str, route: str) -> None:
        """``address`` presented a wrong admin token (or none): one attempt used, one line."""
        bucket = self._buckets.get(address)
        if bucket is None:
            self._make_room()
            bucket = self._buckets[address] = _Bucket(self._burst, self._clock())
        else:
            self._refill(bucket)
        bucket.attempts = max(bucket.attempts - 1, 0)
        log.warning(
            "admin sign-in failed",
            extra={
                "client_address": address,
                "route": route,
                "attempts_left": math.floor(bucket.attempts),
            },
        )

    def _refill(self, bucket: _Bucket) -> float:
        now = self._clock()
        gained = max(now - bucket.updated, 0) / self._refill_seconds
        bucket.attempts = min(bucket.attempts + gained, self._burst)
        bucket.updated = now
        return now

    def _make_room(self) -> None:
        """At the bound, forget addresses whose bucket is full again, then the oldest ones.

        Down to nine tenths of the bound: a storm from many addresses scans the table once per
        tenth of it, not once per new address.
        """
        if len(self._buckets) < self._max_addresses:
            return
        for address, bucket in list(self._buckets.items()):
            self._refill(bucket)
            if bucket.attempts >= self._burst:
                del self._buckets[address]
        while len(self._buckets) > self._max_addresses * 9 // 10:
            del self._buckets[next(iter(self._buckets))]


@attrs.frozen
class SignInGuard:
    """The throttle, for requests: the client's address found as TRUST_FORWARDED_HEADERS says."""

    throttle: SignInThrottle
    trust_forwarded: bool = attrs.field(kw_only=True)

    def admit(self, request: web.Request) -> None:
        self.throttle.admit(self._address(request), request.path)

    def failed(self, request: web.Request) -> None:
        self.throttle.failed(self._address(request), request.path)

    def _address(self, request: web.Request) -> str:
        return client_address(request, trust_forwarded=self.trust_forwarded)
