"""Every health channel keeps the same contract (memory, Postgres, Redis): two replicas' routing
policies on one store see each other's breakers within a second, and a message that cannot be
read changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import attrs
import pytest

from llmgw.providers.base import Deployment
from llmgw.routing.breaker import FAILURES_TO_OPEN
from llmgw.routing.channel import CHANNEL, HealthChannel
from llmgw.routing.memory import MemoryHealthChannel, MemoryHealthHub
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.postgres import PostgresHealthChannel
from llmgw.routing.strategy import ORDERED
from tests.limits.test_store_contract import REDIS, REDIS_URL

BACKENDS = ["memory", "postgres", REDIS]


@attrs.frozen
class StubProvider:
    name: str


@attrs.frozen
class Replicas:
    first: RoutingPolicy
    second: RoutingPolicy
    backend: str
    channel_name: str


@pytest.fixture(params=BACKENDS)
async def replicas(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Replicas]:
    hub = MemoryHealthHub()
    name = f"llmgw_health_test_{uuid.uuid4().hex[:8]}"

    def channel() -> HealthChannel:
        if request.param == "memory":
            return MemoryHealthChannel(hub)
        if request.param == "postgres":
            return PostgresHealthChannel(database_url)
        from llmgw.routing.redis import RedisHealthChannel

        assert REDIS_URL is not None
        return RedisHealthChannel(REDIS_URL, channel=name)

    policies = []
    for _ in range(2):
        policy = RoutingPolicy()
        await policy.start(channel())
        policies.append(policy)
    yield Replicas(policies[0], policies[1], request.param, name)
    for policy in policies:
        await policy.close()


async def eventually(condition: object, within: float) -> float:
    """Seconds until ``condition()`` held; fails past ``within``."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not condition():  # type: ignore[operator]
        assert loop.time() - started < within, "not within the time allowed"
        await asyncio.sleep(0.01)
    return loop.time() - started


def route() -> list[Deployment]:
    prefix = uuid.uuid4().hex[:8]
    return [Deployment(StubProvider(f"{prefix}-{n}"), "m") for n in ("a", "b")]  # type: ignore[arg-type]


async def test_a_deployment_one_replica_found_down_is_skipped_by_the_other_within_a_second(
    replicas: Replicas,
) -> None:
    deployments = route()
    down = deployments[0]
    replicas.first.configure({down.provider.name: 0.5})
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(down).failed()
    assert replicas.first.plan(deployments, ORDERED) == [deployments[1]]
    await eventually(lambda: replicas.second.plan(deployments, ORDERED) == [deployments[1]], 1.0)
    assert replicas.second.health(down.label).state == "open"
    # It recovers: the first replica's probe succeeds, and both return to it.
    await asyncio.sleep(0.5)
    probe = replicas.first.plan(deployments, ORDERED)
    assert probe == deployments
    attempt = replicas.first.attempt(down)
    attempt.answered()
    attempt.done()
    assert replicas.first.plan(deployments, ORDERED) == deployments
    await eventually(lambda: replicas.second.health(down.label).state == "closed", 1.0)
    assert replicas.second.plan(deployments, ORDERED) == deployments


async def test_a_429s_wait_reaches_the_other_replica(replicas: Replicas) -> None:
    deployments = route()
    replicas.first.attempt(deployments[0]).failed(retry_after=60.0)
    await eventually(lambda: replicas.second.health(deployments[0].label).state == "open", 1.0)
    until = replicas.second.health(deployments[0].label).open_until
    assert until == replicas.first.health(deployments[0].label).open_until


async def test_a_message_that_cannot_be_read_changes_nothing(
    replicas: Replicas, db: asyncpg.Connection
) -> None:
    deployments = route()
    garbage = ['{"deployment": 1}', "not json", '{"deployment": "x:m", "open_until": "soon"}']
    for payload in garbage:
        if replicas.backend == "postgres":
            await db.execute("SELECT pg_notify($1, $2)", CHANNEL, payload)
        elif replicas.backend == "redis":
            import redis.asyncio as aioredis

            assert REDIS_URL is not None
            client = aioredis.from_url(REDIS_URL)
            await client.publish(replicas.channel_name, payload)
            await client.aclose()
    # Then a real change still arrives: the listener survived what came before it.
    for _ in range(FAILURES_TO_OPEN):
        replicas.first.attempt(deployments[0]).failed()
    await eventually(lambda: replicas.second.health(deployments[0].label).state == "open", 1.0)
    assert replicas.second.health("x:m").state == "closed"
