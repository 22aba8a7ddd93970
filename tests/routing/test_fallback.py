"""FallbackChain asks the routing policy for the order and tells it every attempt's outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import attrs
import pytest

from llmgw.accounting.usage import CostReport
from llmgw.config.kinds import Capabilities
from llmgw.config.providers_file import Cooldown
from llmgw.errors import RateLimited, UpstreamBusy, UpstreamUnavailable
from llmgw.limits.caps import AccountCap, CapHold, ProviderCaps
from llmgw.limits.memory import MemoryLimitStore
from llmgw.providers.base import (
    Decision,
    Deployment,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
)
from llmgw.routing.breaker import FAILURES_TO_OPEN
from llmgw.routing.channel import HealthChange
from llmgw.routing.fallback import FallbackChain
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.retry import CONTEXT_TOO_LONG

OK = UpstreamResponse(200, b"{}", "application/json")


@attrs.define
class Stub:
    """A provider whose answer the test sets; it counts its calls."""

    name: str
    answer: Callable[[], UpstreamResponse]
    calls: int = 0
    retries_allowed: list[int | None] = attrs.field(factory=list)  # each call's max_retries
    capabilities: Capabilities = attrs.field(factory=lambda: Capabilities(reasoning=True))
    server_address: str = "stub"
    server_port: int = 443
    cost_report: CostReport | None = None
    publishes_prices: bool = False

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        self.calls += 1
        self.retries_allowed.append(call.max_retries)
        return self.answer()


def fails_with(
    status: int, decision: Decision, retry_after: str | None = None
) -> Callable[[], UpstreamResponse]:
    """An error answer, after the provider's retries, with what ``retry.decide`` made of it."""

    def answer() -> UpstreamResponse:
        response = UpstreamResponse(status, b"{}", "application/json", retry_after=retry_after)
        raise UpstreamHTTPError(response, decision)

    return answer


def unreachable() -> UpstreamResponse:
    raise UpstreamUnavailable("down")


def chain(*stubs: Stub) -> FallbackChain:
    deployments = [Deployment(stub, "m") for stub in stubs]  # type: ignore[arg-type]
    return FallbackChain(deployments, routing=RoutingPolicy())


CALL = UpstreamCall(body=b'{"model": "m"}', deadline=0.0, model="m")


@attrs.frozen
class Admission:
    """What a request's admission ticket does for routing: count on the limits' provider caps."""

    caps: ProviderCaps

    async def take_cap(self, provider: str, cap: AccountCap, body: bytes) -> CapHold | float:
        return await self.caps.take(provider, cap, body)


async def ask(route: FallbackChain) -> str:
    call = attrs.evolve(CALL, admission=Admission(route.routing.caps))
    answer = await route.first_answer(call, lambda p, c: p.chat_completion(c))
    answer.done(None)
    return answer.deployment.provider.name


async def test_a_deployment_that_keeps_failing_is_skipped_after_a_few_requests() -> None:
    down, up = Stub("down", unreachable), Stub("up", lambda: OK)
    route = chain(down, up)
    for _ in range(10):
        assert await ask(route) == "up"
    assert down.calls == FAILURES_TO_OPEN
    assert route.routing.health("down:m").state == "open"


async def test_a_429_with_retry_after_opens_it_at_once() -> None:
    limited, up = (
        Stub("limited", fails_with(429, Decision("move_on", "rate_limited"), "20")),
        Stub("up", lambda: OK),
    )
    route = chain(limited, up)
    for _ in range(5):
        assert await ask(route) == "up"
    assert limited.calls == 1
    health = route.routing.health("limited:m")
    assert health.state == "open"
    assert health.open_until is not None


async def test_a_refusal_of_the_request_is_no_failure_of_the_deployment() -> None:
    strict = Stub("strict", fails_with(400, Decision("stop", "refused")))
    route = chain(strict, Stub("other", lambda: OK))
    for _ in range(FAILURES_TO_OPEN * 2):
        with pytest.raises(UpstreamHTTPError):
            await ask(route)
    assert route.routing.health("strict:m").state == "closed"
    assert route.routing.health("strict:m").in_flight == 0


async def test_a_context_too_long_moves_on_without_counting_against_the_deployment() -> None:
    small = Stub("small", fails_with(400, Decision("move_on", CONTEXT_TOO_LONG)))
    deployments = [Deployment(small, "8k"), Deployment(Stub("large", lambda: OK), "128k")]
    route = FallbackChain(deployments, routing=RoutingPolicy())  # type: ignore[list-item]
    for _ in range(FAILURES_TO_OPEN * 2):
        assert await ask(route) == "large"
    assert small.calls == FAILURES_TO_OPEN * 2
    assert route.routing.health("small:8k").state == "closed"


async def test_overload_past_its_retries_counts_as_a_failure() -> None:
    busy = Stub("busy", fails_with(503, Decision("move_on", "overloaded")))
    route = chain(busy, Stub("calm", lambda: OK))
    for _ in range(FAILURES_TO_OPEN * 2):
        assert await ask(route) == "calm"
    assert busy.calls == FAILURES_TO_OPEN
    assert route.routing.health("busy:m").state == "open"


async def test_a_request_never_sent_for_want_of_a_connection_is_no_failure() -> None:
    def busy() -> UpstreamResponse:
        raise UpstreamBusy("every connection is in use")

    full = Stub("full", busy)
    route = chain(full, Stub("other", lambda: OK))
    for _ in range(FAILURES_TO_OPEN * 2):
        assert await ask(route) == "other"
    assert full.calls == FAILURES_TO_OPEN * 2
    assert route.routing.health("full:m").state == "closed"


async def test_when_the_only_deployment_is_open_it_is_still_tried() -> None:
    down = Stub("down", unreachable)
    route = chain(down)
    for _ in range(FAILURES_TO_OPEN + 2):
        with pytest.raises(UpstreamUnavailable):
            await ask(route)
    assert down.calls == FAILURES_TO_OPEN + 2


async def test_only_the_last_deployment_left_is_retried_and_one_known_down_never() -> None:
    overloaded = fails_with(503, Decision("move_on", "overloaded"))
    first, second = Stub("first", overloaded), Stub("second", overloaded)
    with pytest.raises(UpstreamHTTPError):
        await ask(chain(first, second))
    assert (first.retries_allowed, second.retries_allowed) == ([0], [None])
    alone = Stub("alone", overloaded)
    route = chain(alone)
    for _ in range(FAILURES_TO_OPEN + 2):
        with pytest.raises(UpstreamHTTPError):
            await ask(route)
    # Open, and tried all the same (nothing else is left): once, no retries.
    assert alone.retries_allowed == [None] * FAILURES_TO_OPEN + [0, 0]


async def test_an_answer_counts_in_flight_until_it_is_done_and_a_cancel_frees_it() -> None:
    gate = asyncio.Event()
    up = Stub("up", lambda: OK)

    async def slow(provider: Stub, call: UpstreamCall) -> UpstreamResponse:
        await gate.wait()
        return await provider.chat_completion(call)

    route = chain(up)
    answer = await route.first_answer(CALL, lambda p, c: p.chat_completion(c))
    assert route.routing.health("up:m").in_flight == 1
    answer.done(None)
    answer.done(None)
    assert route.routing.health("up:m").in_flight == 0
    waiting = asyncio.create_task(route.first_answer(CALL, slow))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert route.routing.health("up:m").in_flight == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert route.routing.health("up:m").in_flight == 0


# Provider account caps -----------------------------------------------------------------------------


def capped_chain(*stubs: Stub, rpm: dict[str, int]) -> FallbackChain:
    route = chain(*stubs)
    route.routing.configure({}, {name: AccountCap(rpm=n) for name, n in rpm.items()})
    # A clock held still 10 s into a minute: no minute ends during a test.
    route.routing.caps.clock = clock = lambda: 1_000_030.0
    route.routing.caps.use(MemoryLimitStore(clock=clock), default_max_output_tokens=16)
    return route


async def test_a_deployment_at_its_providers_cap_is_moved_on_from_without_a_call() -> None:
    first, second = Stub("first", lambda: OK), Stub("second", lambda: OK)
    route = capped_chain(first, second, rpm={"first": 1})
    assert [await ask(route) for _ in range(3)] == ["first", "second", "second"]
    assert (first.calls, second.calls) == (1, 2)
    assert route.routing.health("first:m").state == "closed", "a capped provider did not fail"


async def test_every_deployment_at_its_cap_is_a_429_with_retry_after() -> None:
    first, second = Stub("first", lambda: OK), Stub("second", lambda: OK)
    route = capped_chain(first, second, rpm={"first": 1, "second": 1})
    await ask(route)
    await ask(route)
    with pytest.raises(RateLimited) as refused:
        await ask(route)
    assert refused.value.code == "provider_capacity_exceeded"
    assert refused.value.headers["Retry-After"] == "50"
    assert (first.calls, second.calls) == (1, 1)


async def test_a_failure_followed_only_by_capped_deployments_reaches_the_caller() -> None:
    down, capped = Stub("down", unreachable), Stub("capped", lambda: OK)
    route = capped_chain(down, capped, rpm={"capped": 1})
    assert await ask(route) == "capped"
    with pytest.raises(UpstreamUnavailable):
        await ask(route)
    assert (down.calls, capped.calls) == (2, 1)


async def test_a_half_open_deployment_skipped_at_its_cap_is_probed_by_a_later_request() -> None:
    now = [1_000_030.0]  # 10 s into a minute
    down = Stub("flaky", unreachable)
    up = Stub("up", lambda: OK)
    routing = RoutingPolicy(clock=lambda: now[0], monotonic=lambda: now[0])
    route = FallbackChain(
        [Deployment(down, "m"), Deployment(up, "m")],  # type: ignore[arg-type]
        routing=routing,
    )
    routing.configure({"flaky": Cooldown(5.0)}, {"flaky": AccountCap(rpm=FAILURES_TO_OPEN)})
    routing.caps.use(MemoryLimitStore(clock=lambda: now[0]), default_max_output_tokens=16)
    for _ in range(FAILURES_TO_OPEN):  # its whole minute's requests, each a failure: it opens
        assert await ask(route) == "up"
    assert routing.health("flaky:m").state == "open"
    now[0] += 10  # past its cooldown: half-open, and its provider still at its cap
    assert await ask(route) == "up"
    assert down.calls == FAILURES_TO_OPEN, "a capped deployment was sent the request"
    down.answer = lambda: OK
    now[0] += 40  # the next minute: the probe goes to it, and it answers
    assert await ask(route) == "flaky"
    assert routing.health("flaky:m").state == "closed"


async def test_a_probe_another_replica_holds_is_skipped_for_the_next_deployment() -> None:
    now = [1_000_030.0]
    store = MemoryLimitStore(clock=lambda: now[0])
    down, up = Stub("flaky", unreachable), Stub("up", lambda: OK)
    routes = []
    for _ in range(2):  # two replicas on one limits store
        routing = RoutingPolicy(clock=lambda: now[0], monotonic=lambda: now[0])
        routing.configure({"flaky": Cooldown(5.0)})
        routing.use(store)
        deployments = [Deployment(down, "m"), Deployment(up, "m")]  # type: ignore[arg-type]
        routes.append(FallbackChain(deployments, routing=routing))
    first, second = routes
    for _ in range(FAILURES_TO_OPEN):
        assert await ask(first) == "up"
    seen = first.routing.health("flaky:m")
    assert seen.open_until is not None and seen.last_failure_at is not None
    # What the health channel delivers to the second replica.
    second.routing.receive(
        HealthChange("flaky:m", seen.open_until, seen.openings, seen.last_failure_at, now[0])
    )
    now[0] += 10  # half-open on both
    down.answer = lambda: OK
    # The first replica's probe is on its way (planned and claimed, not answered yet).
    (probe, _) = first.routing.plan(first.deployments, first.strategy)
    assert await first.routing.claim(probe)
    held = first.routing.attempt(probe)
    calls = down.calls
    assert await ask(second) == "up"
    assert down.calls == calls, "a second probe was sent"
    held.abandoned()  # its caller left: the claim is given back
    await asyncio.sleep(0)
    assert await ask(second) == "flaky"
    assert second.routing.health("flaky:m").state == "closed"
