"""A deployment's breaker, on a clock the test moves: opens after a few failures, keeps its
cooldown while probes fail (grows only past the operator's limit, never past the longest opening),
lets one probe through, closes on a success, and does not open for one caller's failures alone."""

from __future__ import annotations

from llmgw.config.providers_file import MAX_COOLDOWN_SECONDS, Cooldown
from llmgw.routing.breaker import FAILURES_TO_OPEN, Breaker, State

COOLDOWN = Cooldown(30.0, most=MAX_COOLDOWN_SECONDS, steady_probes=2)


def fail(
    breaker: Breaker,
    now: float,
    times: int = 1,
    *,
    retry_after: float | None = None,
    probe: bool = False,
    cooldown: Cooldown = COOLDOWN,
    caller: str = "",
    others_served: bool = False,
) -> bool:
    """``times`` failed calls at ``now``; whether any of them opened the breaker (further)."""
    opened = [
        breaker.failed(
            now,
            cooldown,
            retry_after=retry_after,
            probe=probe,
            caller=caller,
            others_served=others_served,
        )
        for _ in range(times)
    ]
    return any(opened)


def test_a_few_consecutive_failures_open_it_for_the_cooldown() -> None:
    breaker = Breaker()
    assert not fail(breaker, 1000.0, FAILURES_TO_OPEN - 1)
    assert breaker.state(1000.0) is State.CLOSED
    assert fail(breaker, 1000.0)
    assert breaker.state(1000.0) is State.OPEN
    assert breaker.state(1000.0 + 30 - 0.01) is State.OPEN
    assert breaker.state(1000.0 + 30) is State.HALF_OPEN


def test_a_success_between_failures_keeps_it_closed() -> None:
    breaker = Breaker()
    for _ in range(10):
        fail(breaker, 1000.0, FAILURES_TO_OPEN - 1)
        assert not breaker.succeeded(1000.0)
    assert breaker.state(1000.0) is State.CLOSED


def test_half_open_lets_one_probe_through_and_its_success_closes_it() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    assert not breaker.take_probe(29)  # still open
    assert breaker.take_probe(30)
    assert not breaker.take_probe(30)  # one at a time
    assert breaker.succeeded(31)
    assert breaker.state(31) is State.CLOSED
    assert breaker.openings == 0


def probe_failures(breaker: Breaker, count: int, cooldown: Cooldown = COOLDOWN) -> list[float]:
    """How long each opening lasted: the first, then one after each of ``count`` failed probes."""
    now = 0.0
    fail(breaker, now, FAILURES_TO_OPEN, cooldown=cooldown)
    lengths = []
    for _ in range(count):
        assert breaker.open_until is not None
        lengths.append(breaker.open_until - now)
        now = breaker.open_until
        assert breaker.take_probe(now)
        assert fail(breaker, now, probe=True, cooldown=cooldown)
    assert breaker.open_until is not None
    return [*lengths, breaker.open_until - now]


def test_failed_probes_keep_the_cooldown_until_more_than_the_limit_then_it_doubles_to_the_cap() -> (
    None
):
    # steady_probes=2: the opening after the first and second failed probe is still 30 s.
    assert probe_failures(Breaker(), 7) == [30, 30, 30, 60, 120, 240, 300, 300]


def test_the_cooldown_never_grows_past_the_longest_opening() -> None:
    cooldown = Cooldown(30.0, most=45.0, steady_probes=0)
    assert probe_failures(Breaker(), 3, cooldown) == [30, 45, 45, 45]


def test_after_closing_the_next_opening_starts_from_the_cooldown_again() -> None:
    breaker = Breaker()
    probe_failures(breaker, 4)  # 60 s now
    breaker.succeeded(5000.0)
    fail(breaker, 6000.0, FAILURES_TO_OPEN)
    assert breaker.open_until == 6000.0 + 30


def test_failures_of_calls_sent_before_it_opened_do_not_lengthen_it() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    assert not fail(breaker, 5.0, 5)
    assert breaker.open_until == 30


def test_retry_after_opens_it_for_exactly_that_long_at_the_first_429() -> None:
    breaker = Breaker()
    assert fail(breaker, 100.0, retry_after=7.0)
    assert breaker.state(106.9) is State.OPEN
    assert breaker.state(107.0) is State.HALF_OPEN
    # A shorter wait said later does not shorten what is known.
    assert not fail(breaker, 101.0, retry_after=1.0)
    assert breaker.open_until == 107.0


def test_a_retry_after_of_a_day_opens_it_no_longer_than_the_longest_opening() -> None:
    breaker = Breaker()
    assert fail(breaker, 100.0, retry_after=86400.0)
    assert breaker.open_until == 100.0 + MAX_COOLDOWN_SECONDS
    fail(breaker, 101.0, retry_after=50 * 365 * 86400.0)  # a date decades ahead
    assert breaker.open_until == 101.0 + MAX_COOLDOWN_SECONDS


def test_a_probe_that_ends_without_an_outcome_frees_the_slot() -> None:
    breaker = Breaker()
    fail(breaker, 0.0, FAILURES_TO_OPEN)
    assert breaker.take_probe(30)
    breaker.release_probe()
    assert breaker.take_probe(30)


def test_one_callers_failures_do_not_open_it_while_others_are_served() -> None:
    breaker = Breaker()
    assert not fail(breaker, 0.0, 10, caller="mallory", others_served=True)
    assert not fail(breaker, 1.0, retry_after=60.0, caller="mallory", others_served=True)
    assert breaker.state(1.0) is State.CLOSED
    # Another caller failing too is the deployment: it opens.
    assert fail(breaker, 2.0, caller="alice", others_served=True)
    assert breaker.state(2.0) is State.OPEN


def test_a_deployment_only_one_caller_uses_still_opens() -> None:
    breaker = Breaker()
    assert fail(breaker, 0.0, FAILURES_TO_OPEN, caller="alice", others_served=False)
    assert breaker.state(0.0) is State.OPEN
