"""The sign-in throttle on a clock of its own: buckets, refills, Retry-After and its log lines."""

from __future__ import annotations

import logging

import pytest

from llmgw.admin.sign_in_guard import SignInThrottle
from llmgw.errors import RateLimited
from tests.processes import Clock

ROUTE = "/console/sign-in"


@pytest.fixture
def clock() -> Clock:
    return Clock()


def throttle(clock: Clock, **overrides: float) -> SignInThrottle:
    settings = {"burst": 3, "refill_seconds": 6.0, "report_seconds": 10.0, **overrides}
    return SignInThrottle(clock=clock, **settings)  # type: ignore[arg-type]


def fail(guard: SignInThrottle, address: str, times: int) -> None:
    for _ in range(times):
        guard.admit(address, ROUTE)
        guard.failed(address, ROUTE)


def test_a_burst_of_failures_then_429_with_retry_after(clock: Clock) -> None:
    guard = throttle(clock)
    fail(guard, "203.0.113.7", 3)
    with pytest.raises(RateLimited) as refused:
        guard.admit("203.0.113.7", ROUTE)
    assert refused.value.status == 429
    assert refused.value.headers == {"Retry-After": "6"}
    clock.now += 4.5  # three quarters of an attempt back: 1.5 s to go, rounded up
    with pytest.raises(RateLimited) as refused:
        guard.admit("203.0.113.7", ROUTE)
    assert refused.value.headers == {"Retry-After": "2"}
    clock.now += 1.5
    fail(guard, "203.0.113.7", 1)  # one attempt came back, and is spent
    with pytest.raises(RateLimited):
        guard.admit("203.0.113.7", ROUTE)


def test_addresses_are_throttled_apart_and_successes_cost_nothing(clock: Clock) -> None:
    guard = throttle(clock)
    for _ in range(100):
        guard.admit("198.51.100.1", ROUTE)  # admitted and then right: nothing taken
    fail(guard, "203.0.113.7", 3)
    guard.admit("198.51.100.1", ROUTE)
    with pytest.raises(RateLimited):
        guard.admit("203.0.113.7", ROUTE)
    clock.now += 18  # the whole burst back
    fail(guard, "203.0.113.7", 3)


def test_every_failure_is_a_warning_and_a_storm_a_few_lines(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.admin.sign_in_guard")
    guard = throttle(clock, report_seconds=1.0)
    fail(guard, "203.0.113.7", 3)
    failures = [r for r in caplog.records if r.getMessage() == "admin sign-in failed"]
    assert [(r.levelname, r.client_address, r.route) for r in failures] == [  # type: ignore[attr-defined]
        ("WARNING", "203.0.113.7", ROUTE)
    ] * 3
    assert [r.attempts_left for r in failures] == [2, 1, 0]  # type: ignore[attr-defined]
    caplog.clear()
    step = 2**-9  # 1000 refusals in 1.95 s (the probe sent 300 in 0.6 s); exact in binary
    for _ in range(1000):
        clock.now += step
        with pytest.raises(RateLimited):
            guard.admit("203.0.113.7", ROUTE)
    clock.now += 1
    with pytest.raises(RateLimited):
        guard.admit("203.0.113.7", ROUTE)
    lines = [r for r in caplog.records if r.getMessage() == "admin sign-ins throttled"]
    # The first refusal at once, then one line a second (report_seconds=1) with the count since.
    assert [r.refused for r in lines] == [1, 512, 488]  # type: ignore[attr-defined]
    assert all(r.client_address == "203.0.113.7" for r in lines)  # type: ignore[attr-defined]


def test_the_table_of_addresses_is_bounded(clock: Clock) -> None:
    guard = throttle(clock, max_addresses=100)
    for index in range(1000):
        fail(guard, f"10.0.{index // 256}.{index % 256}", 1)
    assert len(guard._buckets) <= 100
    fail(guard, "10.0.3.231", 2)  # the newest address is still remembered: one attempt used
    with pytest.raises(RateLimited):
        guard.admit("10.0.3.231", ROUTE)
