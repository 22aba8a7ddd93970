"""The /v1/models cache: callers share one refresh, and a failure is remembered briefly."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from llmgw.api.models import ModelListCache
from llmgw.errors import UpstreamTimeout
from llmgw.providers.base import UpstreamResponse
from llmgw.routing.registry import ProviderRegistry
from tests.processes import Clock, eventually

TIMEOUT = 0.5


class ListingProvider:
    """A provider whose /models answers (or fails) once ``released`` is set; it keeps the deadline
    of each call, and says whether the last one ended."""

    name = "slow"
    server_address = "127.0.0.1"
    server_port = 1
    cost_report = None
    publishes_prices = False

    def __init__(self) -> None:
        self.deadlines: list[float] = []
        self.fails = False
        self.released = asyncio.Event()
        self.released.set()
        self.listing = False

    @property
    def calls(self) -> int:
        return len(self.deadlines)

    async def list_models(self, deadline: float) -> UpstreamResponse:
        self.deadlines.append(deadline)
        self.listing = True
        try:
            await self.released.wait()
        finally:
            self.listing = False
        if self.fails:
            raise UpstreamTimeout("slow did not answer in time.")
        body = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
        return UpstreamResponse(status=200, body=body, content_type="application/json")

    async def close(self) -> None:
        pass


def registry_of(provider: ListingProvider) -> ProviderRegistry:
    return ProviderRegistry([provider])  # type: ignore[list-item]


async def test_callers_never_queue_behind_a_hanging_listing() -> None:
    provider = ListingProvider()
    provider.released.clear()
    provider.fails = True
    registry = registry_of(provider)
    cache = ModelListCache()
    started = asyncio.get_running_loop().time()
    callers = []
    for _ in range(5):  # each arrives while the first one's listing hangs
        callers.append(asyncio.create_task(cache.get(registry, TIMEOUT)))
        await eventually(lambda: provider.listing, what="the listing runs")
    assert provider.calls == 1
    # Every caller waits for that one listing, which must answer by the first caller's deadline.
    assert provider.deadlines[0] - started == pytest.approx(TIMEOUT, abs=0.1)
    assert not any(caller.done() for caller in callers)
    provider.released.set()  # it times out
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(result, UpstreamTimeout) for result in results), results
    assert provider.calls == 1


async def test_a_failure_is_remembered_briefly_then_retried() -> None:
    provider = ListingProvider()
    provider.fails = True
    registry = registry_of(provider)
    clock = Clock()
    cache = ModelListCache(failure_ttl=0.3, clock=clock)
    with pytest.raises(UpstreamTimeout):
        await cache.get(registry, TIMEOUT)
    clock.now += 0.29
    with pytest.raises(UpstreamTimeout):
        await cache.get(registry, TIMEOUT)
    assert provider.calls == 1
    clock.now += 0.01
    provider.fails = False
    assert b'"m"' in await cache.get(registry, TIMEOUT)
    assert provider.calls == 2


async def test_an_expired_list_is_served_while_it_is_refreshed() -> None:
    provider = ListingProvider()
    registry = registry_of(provider)
    clock = Clock()
    cache = ModelListCache(ttl=0.05, clock=clock)
    first = await cache.get(registry, TIMEOUT)
    clock.now += 0.04
    assert await cache.get(registry, TIMEOUT) == first
    assert provider.calls == 1  # not expired yet
    clock.now += 0.01
    provider.released.clear()
    provider.fails = True
    # While the refresh hangs, at once (bounded, so that waiting for it fails instead of hanging).
    assert await asyncio.wait_for(cache.get(registry, TIMEOUT), 1.0) == first
    await eventually(lambda: provider.listing, what="the refresh runs")
    assert provider.calls == 2
    provider.released.set()  # the background refresh times out quietly
    await eventually(lambda: not provider.listing, what="the refresh ended")
    assert await cache.get(registry, TIMEOUT) == first
