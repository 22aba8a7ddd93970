"""A deployment's breaker, on a clock the test moves: opens after a few failures, doubles its
cooldown while the deployment keeps failing, lets one probe through, closes on a success."""

from __future__ import annotations

from llmgw.routing.breaker import FAILURES_TO_OPEN, MAX_COOLDOWN_SECONDS, Breaker, State

COOLDOWN = 30.0


def fail(
    breaker: Breaker,
    now: float,
    times: int = 1,
    *,
    retry_after: float | None = None,
    probe: bool = False,
) -> bool:
    """``times`` failed calls at ``now``; whether any of them opened the breaker (further)."""
    opened = [
        breaker.failed(now, cooldown=COOLDOWN, retry_after=retry_after, probe=probe)
        for _ in range(times)
    ]
    return any(opened)


def test_a_few_consecutive_failures_open_it_for_the_cooldown() -> None:
    breaker = Breaker()
    assert not fail(breaker, 1000.0, FAILURES_TO_OPEN - 1)
    assert breaker.state(1000.0) is State.CLOSED
    assert fail(breaker, 1000.0)
    assert breaker.state(1000.0) is State.OPEN
    assert breaker.state(1000.0 + COOLDOWN - 0.01) is State.OPEN
    assert breaker.state(1000.0 + COOLDOWN) is State.HALF_OPEN


def test_a_success_between_failures_keeps_it_closed() -> None:
    breaker = Breaker()
    for _ in range(10):
        fail(breaker, 1000.0, FAILURES_TO_OPEN - 1)
        assert not breaker.succeeded(1000.0)
    assert breaker.state(1000.0) is State.CLOSED


def test_half_open_lets_one_probe_through_and_its_success_closes_it() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    assert not breaker.take_probe(COOLDOWN - 1)  # still open
    assert breaker.take_probe(COOLDOWN)
    assert not breaker.take_probe(COOLDOWN)  # one at a time
    assert breaker.succeeded(COOLDOWN + 1)
    assert breaker.state(COOLDOWN + 1) is State.CLOSED
    assert breaker.openings == 0


def test_a_failed_probe_opens_it_again_for_twice_as_long_up_to_the_cap() -> None:
    breaker = Breaker()
    now = 0.0
    fail(breaker, now, FAILURES_TO_OPEN)
    expected = COOLDOWN
    lengths = []
    for _ in range(6):
        assert breaker.open_until is not None
        lengths.append(breaker.open_until - now)
        now = breaker.open_until
        assert breaker.take_probe(now)
        assert fail(breaker, now, probe=True)
    for length in lengths:
        assert length == expected
        expected = min(expected * 2, MAX_COOLDOWN_SECONDS)
    assert lengths[-1] == MAX_COOLDOWN_SECONDS


def test_after_closing_the_next_opening_starts_from_the_cooldown_again() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    breaker.take_probe(COOLDOWN)
    fail(breaker, COOLDOWN, probe=True)  # 60 s now
    breaker.succeeded(500.0)
    fail(breaker, 600.0, FAILURES_TO_OPEN)
    assert breaker.open_until == 600.0 + COOLDOWN


def test_failures_of_calls_sent_before_it_opened_do_not_lengthen_it() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    assert not fail(breaker, 5.0, 5)
    assert breaker.open_until == COOLDOWN


def test_retry_after_opens_it_for_exactly_that_long_at_the_first_429() -> None:
    breaker = Breaker()
    assert fail(breaker, 100.0, retry_after=7.0)
    assert breaker.state(106.9) is State.OPEN
    assert breaker.state(107.0) is State.HALF_OPEN
    # A shorter wait said later does not shorten what is known.
    assert not fail(breaker, 101.0, retry_after=1.0)
    assert breaker.open_until == 107.0


def test_a_probe_that_ends_without_an_outcome_frees_the_slot() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    assert breaker.take_probe(COOLDOWN)
    breaker.release_probe()
    assert breaker.take_probe(COOLDOWN)


def test_a_longer_own_cooldown_is_its_own_cap() -> None:
    breaker = Breaker()
    breaker.failed(0.0, cooldown=600.0)
    breaker.failed(0.0, cooldown=600.0)
    breaker.failed(0.0, cooldown=600.0)
    assert breaker.open_until == 600.0
    breaker.take_probe(600.0)
    breaker.failed(600.0, cooldown=600.0, probe=True)
    assert breaker.open_until == 1200.0
