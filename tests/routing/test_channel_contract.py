"""Every health channel keeps the same contract (memory, Postgres, Redis): two replicas' routing
policies on one store see each other's breakers and load within a second, a replica that starts
knows the breakers open before it, one replica at a time probes a deployment, and a message that
cannot be read changes nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable

import asyncpg
import attrs
import pytest

from llmgw.config.providers_file import ORDERED, Cooldown, Strategy
from llmgw.limits.store import LimitStore
from llmgw.providers.base import Deployment
from llmgw.routing.breaker import FAILURES_TO_OPEN
from llmgw.routing.channel import CHANNEL, LOAD_CHANNEL, HealthChange, HealthChannel
from llmgw.routing.memory import MemoryHealthChannel, MemoryHealthHub
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.postgres import PostgresHealthChannel
from tests.limits.test_store_contract import REDIS, REDIS_URL, started_store
from tests.processes import Clock, eventually

BACKENDS = ["memory", "postgres", REDIS]


@attrs.frozen
class StubProvider:
    name: str


@attrs.define
class Replicas:
    backend: str
    channel_name: str
    store: LimitStore  # the limits store they share (probe claims)
    channel: Callable[[], HealthChannel]
    clock: Clock  # the replicas' wall clock: a test moves it past a cooldown
    started: list[RoutingPolicy] = attrs.Factory(list)

    async def start(self) -> RoutingPolicy:
        """One more replica's routing policy on the shared store."""
        policy = RoutingPolicy(clock=self.clock)
        await policy.start(self.channel())
        policy.use(self.store)
        self.started.append(policy)
        return policy

    @property
    def first(self) -> RoutingPolicy:
        return self.started[0]

    @property
    def second(self) -> RoutingPolicy:
        return self.started[1]


@pytest.fixture(params=BACKENDS)
async def replicas(
    request: pytest.FixtureRequest, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Replicas]:
    hub = MemoryHealthHub()
    clock = Clock(time.time())
    name = f"llmgw_health_test_{uuid.uuid4().hex[:8]}"

    def channel() -> HealthChannel:
        if request.param == "memory":
            return MemoryHealthChannel(hub)
        if request.param == "postgres":
            return PostgresHealthChannel(database_url)
        from llmgw.routing.redis import RedisHealthChannel

        assert REDIS_URL is not None
        return RedisHealthChannel(REDIS_URL, channel=name, clock=clock)

    async with started_store(request.param, database_url) as store:
        replicas = Replicas(request.param, name, store, channel, clock)
        for _ in range(2):
            await replicas.start()
        yield replicas
        for policy in replicas.started:
            await policy.close()


def route() -> list[Deployment]:
    prefix = uuid.uuid4().hex[:8]
    return [Deployment(StubProvider(f"{prefix}-{n}"), "m") for n in ("a", "b")]  # type: ignore[arg-type]


async def test_a_deployment_one_replica_found_down_is_skipped_by_the_other_within_a_second(
    replicas: Replicas,
) -> None:
    deployments = route()
    down = deployments[0]
    replicas.first.configure({down.provider.name: Cooldown(0.5)})
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(down).failed()
    assert replicas.first.plan(deployments, ORDERED) == [deployments[1]]
    await eventually(
        lambda: replicas.second.plan(deployments, ORDERED) == [deployments[1]], within=1.0
    )
    assert replicas.second.health(down.label).state == "open"
    # It recovers: the first replica's probe succeeds, and both return to it.
    reopens = replicas.first.health(down.label).open_until
    assert reopens is not None
    replicas.clock.now = reopens - 0.01
    assert replicas.first.plan(deployments, ORDERED) == [deployments[1]]
    replicas.clock.now = reopens
    probe = replicas.first.plan(deployments, ORDERED)
    assert probe == deployments
    attempt = replicas.first.attempt(down)
    attempt.answered()
    attempt.done()
    assert replicas.first.plan(deployments, ORDERED) == deployments
    await eventually(lambda: replicas.second.health(down.label).state == "closed", within=1.0)
    assert replicas.second.plan(deployments, ORDERED) == deployments


async def test_a_429s_wait_reaches_the_other_replica(replicas: Replicas) -> None:
    deployments = route()
    replicas.first.attempt(deployments[0]).failed(retry_after=60.0)
    await eventually(
        lambda: replicas.second.health(deployments[0].label).state == "open", within=1.0
    )
    until = replicas.second.health(deployments[0].label).open_until
    assert until == replicas.first.health(deployments[0].label).open_until


async def test_a_message_that_cannot_be_read_changes_nothing(
    replicas: Replicas, db: asyncpg.Connection
) -> None:
    deployments = route()
    garbage = [
        '{"deployment": 1}',
        "not json",
        '{"deployment": "x:m", "open_until": "soon"}',
        '{"replica": "r", "in_flight": {"x:m": -4}, "ttl": 3}',
        '{"replica": "r", "in_flight": ["x:m"], "ttl": 3}',
        "[]",
    ]
    for payload in garbage:
        for channel in (CHANNEL, LOAD_CHANNEL):
            if replicas.backend == "postgres":
                await db.execute("SELECT pg_notify($1, $2)", channel, payload)
            elif replicas.backend == "redis":
                import redis.asyncio as aioredis

                assert REDIS_URL is not None
                client = aioredis.from_url(REDIS_URL)
                name = replicas.channel_name
                await client.publish(name if channel == CHANNEL else f"{name}:load", payload)
                await client.aclose()
    # Then a real change still arrives: the listener survived what came before it.
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(deployments[0]).failed()
    await eventually(
        lambda: replicas.second.health(deployments[0].label).state == "open", within=1.0
    )
    assert replicas.second.health("x:m").state == "closed"
    assert replicas.second.health("x:m").in_flight_all_replicas == 0


async def test_least_busy_moves_traffic_away_from_a_deployment_busy_on_the_other_replica(
    replicas: Replicas,
) -> None:
    deployments = route()
    least_busy = Strategy("least-busy")
    assert replicas.first.plan(deployments, least_busy) == deployments  # equal: listed order
    held = [replicas.second.attempt(deployments[0]) for _ in range(3)]
    await eventually(
        lambda: replicas.first.plan(deployments, least_busy) == deployments[::-1], within=1.5
    )
    assert replicas.first.health(deployments[0].label).in_flight == 0  # none of its own
    assert replicas.first.health(deployments[0].label).in_flight_all_replicas == 3
    for attempt in held:
        attempt.done()
    await eventually(
        lambda: replicas.first.plan(deployments, least_busy) == deployments, within=1.5
    )


async def test_a_replica_that_starts_skips_a_deployment_found_down_before_it_started(
    replicas: Replicas,
) -> None:
    deployments = route()
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(deployments[0]).failed()
    await eventually(
        lambda: replicas.second.health(deployments[0].label).state == "open", within=1.0
    )
    started = await replicas.start()  # a replica started (or restarted) now: no change since
    assert started.plan(deployments, ORDERED) == [deployments[1]]
    assert started.health(deployments[0].label).open_until == (
        replicas.first.health(deployments[0].label).open_until
    )


async def test_a_replica_that_starts_does_not_skip_a_deployment_that_recovered(
    replicas: Replicas,
) -> None:
    deployments = route()
    replicas.first.configure({deployments[0].provider.name: Cooldown(0.2)})
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(deployments[0]).failed()
    replicas.clock.now += 0.2
    assert replicas.first.plan(deployments, ORDERED) == deployments  # its probe
    attempt = replicas.first.attempt(deployments[0])
    attempt.answered()
    attempt.done()
    await eventually(
        lambda: replicas.second.health(deployments[0].label).state == "closed", within=1.0
    )
    started = await replicas.start()
    assert started.plan(deployments, ORDERED) == deployments


async def test_one_replica_at_a_time_probes_a_deployment(replicas: Replicas) -> None:
    deployments = route()
    down = deployments[0]
    replicas.first.configure({down.provider.name: Cooldown(0.3)})
    replicas.second.configure({down.provider.name: Cooldown(0.3)})
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(down).failed()
    await eventually(lambda: replicas.second.health(down.label).state == "open", within=1.0)
    replicas.clock.now += 0.3
    # Both plan it as their probe; the store lets one of them send it.
    assert replicas.first.plan(deployments, ORDERED) == deployments
    assert replicas.second.plan(deployments, ORDERED) == deployments
    assert await replicas.first.claim(down)
    assert not await replicas.second.claim(down)
    # The second replica's next request does not wait for it: the other deployment takes it.
    assert replicas.second.plan(deployments, ORDERED) == deployments  # planned as probe again
    assert not await replicas.second.claim(down)
    # The probe's caller left: the claim is given back, and the other replica probes.
    replicas.first.attempt(down).abandoned()
    await eventually(lambda: not replicas.first._releases, within=1.0)
    assert replicas.second.plan(deployments, ORDERED) == deployments
    assert await replicas.second.claim(down)
    # Its probe fails: the breaker opens again, and the next probe is claimed afresh.
    replicas.second.attempt(down).failed()
    await eventually(lambda: replicas.first.health(down.label).openings == 2, within=1.0)
    reopens = replicas.first.health(down.label).open_until
    assert reopens == pytest.approx(replicas.clock.now + 0.6)  # twice the cooldown, this time
    replicas.clock.now = reopens - 0.01
    assert replicas.first.plan(deployments, ORDERED) == [deployments[1]]
    replicas.clock.now = reopens
    assert replicas.first.plan(deployments, ORDERED) == deployments
    assert await replicas.first.claim(down)


async def publish_in_turn(replicas: Replicas, changes: list[HealthChange]) -> None:
    """Written to the store in this order, as two replicas' late and early writes may be."""
    channel = replicas.channel()
    await channel.start(lambda _message: None)
    try:
        for change in changes:
            await channel.publish(change)
    finally:
        await channel.close()


def change(label: str, changed_at: float, open_for: float | None) -> HealthChange:
    until = None if open_for is None else changed_at + open_for
    return HealthChange(label, until, 1 if until else 0, changed_at, changed_at)


@pytest.mark.parametrize("later", ["closed", "open for less", "open for more"])
async def test_a_replica_that_starts_is_told_the_newest_change_whatever_order_it_was_written_in(
    replicas: Replicas, later: str
) -> None:
    deployments = route()
    label, other = deployments[0].label, deployments[1].label
    now = time.time()
    newest = change(label, now + 2, None if later == "closed" else 30.0)
    older = change(label, now + 1, 20.0 if later == "open for more" else 60.0)
    # Between the two, a change of another deployment (what Postgres tidies up on).
    await publish_in_turn(replicas, [newest, change(other, now, 5.0), older])
    started = await replicas.start()
    health = started.health(label)
    assert (health.state, health.open_until) == (
        ("closed", None) if later == "closed" else ("open", newest.open_until)
    )
    # The replicas already running were told of both, and took the newest.
    for policy in replicas.started:
        await eventually(lambda p=policy: p.health(label).open_until == newest.open_until)
