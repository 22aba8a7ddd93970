"""The routing policy with no network: a clock and a seeded random source the test holds."""

from __future__ import annotations

import random
from collections import Counter

import attrs
import pytest

from llmgw.config.providers_file import ORDERED, Cooldown, Strategy
from llmgw.providers.base import Deployment
from llmgw.routing.breaker import FAILURES_TO_OPEN
from llmgw.routing.channel import HealthChange, LoadReport
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.strategy import EXPLORE_SHARE
from tests.processes import Clock


@attrs.frozen
class StubProvider:
    name: str


def deployments(*names: str) -> list[Deployment]:
    return [Deployment(StubProvider(name), "m") for name in names]  # type: ignore[arg-type]


def policy(clock: Clock | None = None, *, seed: int = 7) -> RoutingPolicy:
    clock = clock or Clock(1_000_000.0)
    return RoutingPolicy(clock=clock, monotonic=clock, rng=random.Random(seed))


def labels(plan: list[Deployment]) -> list[str]:
    return [d.provider.name for d in plan]


def take_down(routing: RoutingPolicy, deployment: Deployment) -> None:
    for _ in range(FAILURES_TO_OPEN):
        routing.attempt(deployment).failed()


def test_ordered_keeps_the_listed_order() -> None:
    routing, route = policy(), deployments("a", "b", "c")
    assert labels(routing.plan(route, ORDERED)) == ["a", "b", "c"]


def test_weighted_splits_within_five_percent_of_the_weights_over_a_thousand_requests() -> None:
    routing, route = policy(seed=2026), deployments("a", "b", "c")
    weights = (5.0, 3.0, 2.0)
    firsts = Counter(
        routing.plan(route, Strategy("weighted", weights))[0].provider.name for _ in range(1000)
    )
    for name, weight in zip("abc", weights, strict=True):
        assert abs(firsts[name] / 1000 - weight / sum(weights)) <= 0.05, firsts


def test_the_weighted_choice_goes_first_and_the_rest_keep_their_order() -> None:
    routing, route = policy(), deployments("a", "b", "c")
    plans = {
        tuple(labels(routing.plan(route, Strategy("weighted", (1, 1, 1))))) for _ in range(200)
    }
    assert plans == {("a", "b", "c"), ("b", "a", "c"), ("c", "a", "b")}


def test_a_zero_weight_is_only_a_fallback() -> None:
    routing, route = policy(), deployments("a", "b")
    plans = {tuple(labels(routing.plan(route, Strategy("weighted", (0, 1))))) for _ in range(200)}
    assert plans == {("b", "a")}


def test_least_busy_moves_traffic_to_the_deployment_with_fewer_requests_in_flight() -> None:
    routing, route = policy(), deployments("a", "b")
    strategy = Strategy("least-busy")
    held = [routing.attempt(route[0]) for _ in range(2)]
    firsts = [routing.plan(route, strategy)[0] for _ in range(3)]
    assert labels(firsts) == ["b", "b", "b"]
    attempts = [routing.attempt(route[1]) for _ in range(3)]  # now b has 3, a has 2
    assert labels(routing.plan(route, strategy)) == ["a", "b"]
    for attempt in held + attempts:
        attempt.done()
    assert labels(routing.plan(route, strategy)) == ["a", "b"]  # equal: the listed order
    assert routing.health("a:m").in_flight == routing.health("b:m").in_flight == 0


def test_least_busy_counts_the_requests_other_replicas_report() -> None:
    clock = Clock()
    routing, route = policy(clock), deployments("a", "b")
    strategy = Strategy("least-busy")
    held = routing.attempt(route[1])  # b: one here
    routing.receive(LoadReport("other", {"a:m": 3}, ttl=3.0))  # a: three on another replica
    assert labels(routing.plan(route, strategy)) == ["b", "a"]
    assert routing.health("a:m").in_flight_all_replicas == 3
    clock.now += 3.0  # the other replica's report lapsed (it stopped reporting)
    assert labels(routing.plan(route, strategy)) == ["a", "b"]
    held.done()


def test_least_latency_moves_traffic_to_the_faster_deployment_and_still_explores() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock, seed=11), deployments("slow", "fast")
    strategy = Strategy("least-latency")
    seconds = {"slow:m": 2.0, "fast:m": 0.2}
    firsts: Counter[str] = Counter()
    for _ in range(1000):
        chosen = routing.plan(route, strategy)[0]
        firsts[chosen.provider.name] += 1
        attempt = routing.attempt(chosen)
        clock.now += seconds[chosen.label]
        attempt.answered()
        attempt.done()
    # Each is measured once, then the fast one gets all but the exploration share.
    assert firsts["fast"] / 1000 >= 1 - EXPLORE_SHARE - 0.03, firsts
    assert firsts["slow"] >= 20, firsts
    assert routing.health("fast:m").latency_seconds == pytest.approx(0.2)


def test_least_latency_follows_a_deployment_that_got_slower() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock, seed=5), deployments("a", "b")
    strategy = Strategy("least-latency")
    seconds = {"a:m": 0.1, "b:m": 0.5}
    for step in range(400):
        if step == 200:
            seconds["a:m"] = 3.0  # a degrades
        chosen = routing.plan(route, strategy)[0]
        attempt = routing.attempt(chosen)
        clock.now += seconds[chosen.label]
        attempt.answered()
        attempt.done()
    last = Counter(routing.plan(route, strategy)[0].provider.name for _ in range(100))
    assert last["b"] > last["a"], last


def test_an_open_deployment_is_left_out_and_the_rest_keep_their_order() -> None:
    routing, route = policy(), deployments("a", "b", "c")
    take_down(routing, route[1])
    assert routing.health("b:m").state == "open"
    assert labels(routing.plan(route, ORDERED)) == ["a", "c"]
    weighted = Strategy("weighted", (0, 1, 0))  # b would be chosen; it is open
    assert labels(routing.plan(route, weighted)) in (["a", "c"], ["c", "a"])


def test_when_every_deployment_is_open_the_least_recently_failed_is_tried() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b", "c")
    for deployment in (route[1], route[2], route[0]):
        take_down(routing, deployment)
        clock.now += 1
    assert labels(routing.plan(route, ORDERED)) == ["b"]


def test_after_the_cooldown_one_request_probes_first_and_its_success_brings_it_back() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    take_down(routing, route[0])
    clock.now += 30
    probe_plan = routing.plan(route, ORDERED)
    assert labels(probe_plan) == ["a", "b"]
    assert labels(routing.plan(route, ORDERED)) == ["b"]  # one probe at a time
    probe = routing.attempt(probe_plan[0])
    probe.answered()
    probe.done()
    assert routing.health("a:m").state == "closed"
    assert labels(routing.plan(route, ORDERED)) == ["a", "b"]


def test_a_failed_probe_keeps_it_out_one_more_cooldown_and_was_asked_once() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    take_down(routing, route[0])
    clock.now += 30
    routing.plan(route, ORDERED)
    probe = routing.attempt(route[0])
    assert probe.once, "a probe is never retried (the route sends it with max_retries=0)"
    probe.failed()
    assert routing.health("a:m").open_until == clock.now + 30


def test_an_opening_another_replica_kept_for_a_day_lasts_no_longer_than_the_cap() -> None:
    clock = Clock(1_000_000.0)
    routing = policy(clock)
    routing.configure({"a": Cooldown(5.0, most=60.0)})
    routing.receive(HealthChange("a:m", clock.now + 86400, 0, clock.now, changed_at=clock.now))
    assert routing.health("a:m").open_until == clock.now + 60


def test_one_keys_failures_do_not_open_a_deployment_another_replica_serves_other_keys_by() -> None:
    clock = Clock(1_000_000.0)
    here, there = policy(clock), policy(clock)
    route = deployments("a", "b")
    served = there.attempt(route[0], "alice")
    served.answered()
    served.done()
    report = there._load.report(clock.now)
    assert report is not None
    here.receive(report)
    for _ in range(FAILURES_TO_OPEN * 3):
        here.attempt(route[0], "mallory").failed(retry_after=86400.0)
    assert here.health("a:m").state == "closed"
    assert labels(here.plan(route, ORDERED)) == ["a", "b"]
    # Once alice has not been served for a while, mallory alone is all it serves: it opens.
    clock.now += 31
    here.attempt(route[0], "mallory").failed()
    assert here.health("a:m").state == "open"


def test_a_deployment_down_for_every_key_opens_though_others_were_served() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    for caller in ("alice", "bob"):
        served = routing.attempt(route[0], caller)
        served.answered()
        served.done()
    for caller in ("mallory", "mallory", "alice"):
        routing.attempt(route[0], caller).failed()
    assert routing.health("a:m").state == "open"


def test_a_probe_whose_caller_left_frees_the_slot() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    take_down(routing, route[0])
    clock.now += 30
    routing.plan(route, ORDERED)
    routing.attempt(route[0]).abandoned()
    assert labels(routing.plan(route, ORDERED)) == ["a", "b"]


def test_retry_after_opens_it_for_that_long() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    routing.attempt(route[0]).failed(retry_after=12.0)
    assert labels(routing.plan(route, ORDERED)) == ["b"]
    clock.now += 12
    assert labels(routing.plan(route, ORDERED)) == ["a", "b"]  # the probe


def test_each_provider_has_its_own_cooldown() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    routing.configure({"a": Cooldown(5.0)})
    take_down(routing, route[0])
    take_down(routing, route[1])
    assert routing.health("a:m").open_until == clock.now + 5
    assert routing.health("b:m").open_until == clock.now + 30


def test_a_change_from_another_replica_is_taken_unless_older_than_what_is_known() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("a", "b")
    routing.receive(HealthChange("a:m", clock.now + 30, 1, clock.now, changed_at=clock.now))
    assert labels(routing.plan(route, ORDERED)) == ["b"]
    routing.receive(HealthChange("a:m", None, 0, clock.now, changed_at=clock.now - 5))  # stale
    assert labels(routing.plan(route, ORDERED)) == ["b"]
    routing.receive(HealthChange("a:m", None, 0, clock.now, changed_at=clock.now + 1))
    assert labels(routing.plan(route, ORDERED)) == ["a", "b"]


def test_a_stream_is_timed_to_its_first_token_not_its_headers() -> None:
    clock = Clock(1_000_000.0)
    routing, route = policy(clock), deployments("quick-headers", "steady")
    for deployment, headers, first_token in ((route[0], 0.05, 3.0), (route[1], 0.4, 0.2)):
        attempt = routing.attempt(deployment)
        clock.now += headers
        attempt.answered()
        assert routing.health(deployment.label).latency_seconds is None  # not before it ends
        attempt.done(first_token)
    assert routing.health("quick-headers:m").latency_seconds == pytest.approx(3.05)
    assert routing.health("steady:m").latency_seconds == pytest.approx(0.6)
    firsts = Counter(
        routing.plan(route, Strategy("least-latency"))[0].provider.name for _ in range(100)
    )
    assert firsts["steady"] > 80, firsts


def test_what_is_remembered_of_deployments_callers_name_is_bounded() -> None:
    routing = policy()
    for n in range(3000):
        (deployment,) = deployments(f"p{n}")
        attempt = routing.attempt(deployment)
        if n % 2:
            attempt.failed()
        else:
            attempt.answered()
            attempt.done()
    assert len(routing.known()) <= 1000
    assert routing.health("p2998:m").latency_seconds is not None  # the newest are kept
    assert routing.health("p2999:m").consecutive_failures == 1


def tell(sender: RoutingPolicy, receiver: RoutingPolicy, now: float) -> None:
    """What the sender's load report would carry to the receiver."""
    report = sender._load.report(now)
    assert report is not None
    receiver.receive(report)


def test_failures_on_two_replicas_add_up_to_open_it_and_an_answer_clears_them() -> None:
    clock = Clock(1_000_000.0)
    here, there = policy(clock), policy(clock)
    route = deployments("a", "b")
    for _ in range(FAILURES_TO_OPEN - 1):
        here.attempt(route[0], "alice").failed()
    tell(here, there, clock.now)
    there.attempt(route[0], "bob").failed()
    assert there.health("a:m").state == "open", "three failures in all, not three per replica"

    # An answer on one replica clears what it told: the others count from nothing again.
    quiet, busy = policy(clock), policy(clock)
    for _ in range(FAILURES_TO_OPEN - 1):
        quiet.attempt(route[0], "alice").failed()
    answered = quiet.attempt(route[0], "alice")
    answered.answered()
    answered.done()
    tell(quiet, busy, clock.now)
    busy.attempt(route[0], "bob").failed()
    assert busy.health("a:m").state == "closed"
