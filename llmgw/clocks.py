"""The clocks the gateway's own timing reads, in one object ``create_app`` hands on: a test passes
clocks it moves instead of waiting for time to pass.

What the database or Redis times (windows, leases, key listings) keeps the server's clock: every
replica must agree on it, and no test can move it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

__all__ = ["SYSTEM_CLOCKS", "Clocks"]


@attrs.frozen
class Clocks:
    # Epoch seconds: moments other replicas and the database also know (a key's expiry, until when
    # a breaker is open).
    wall: Callable[[], float] = time.time
    # Intervals this process alone measures (a cache's lifetime, a throttle's refill).
    monotonic: Callable[[], float] = time.monotonic


SYSTEM_CLOCKS = Clocks()
