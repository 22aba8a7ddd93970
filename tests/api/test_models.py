"""The /v1/models cache: callers share one refresh, and a failure is remembered briefly."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from llmgw.api.models import ModelListCache
from llmgw.errors import UpstreamTimeout
from llmgw.providers.base import UpstreamResponse
from llmgw.providers.registry import ProviderRegistry

TIMEOUT = 0.5


class ListingProvider:
    """A provider whose /models hangs until the deadline, or answers; it counts the calls."""

    name = "slow"
    server_address = "127.0.0.1"
    server_port = 1
    reports_cost = False
    publishes_prices = False

    def __init__(self) -> None:
        self.calls = 0
        self.hang = True

    async def list_models(self, deadline: float) -> UpstreamResponse:
        self.calls += 1
        if self.hang:
            await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
            raise UpstreamTimeout("slow did not answer in time.")
        body = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
        return UpstreamResponse(status=200, body=body, content_type="application/json")

    async def close(self) -> None:
        pass


async def timed_get(cache: ModelListCache, registry: ProviderRegistry) -> tuple[float, object]:
    started = time.monotonic()
    try:
        result: object = await cache.get(registry, TIMEOUT)
    except UpstreamTimeout as exc:
        result = exc
    return time.monotonic() - started, result


async def test_callers_never_queue_behind_a_hanging_listing() -> None:
    provider = ListingProvider()
    registry = ProviderRegistry([provider])  # type: ignore[list-item]
    cache = ModelListCache()
    callers = []
    for _ in range(5):
        callers.append(asyncio.create_task(timed_get(cache, registry)))
        await asyncio.sleep(0.05)
    results = await asyncio.gather(*callers)
    assert all(isinstance(result, UpstreamTimeout) for _, result in results)
    slowest = max(elapsed for elapsed, _ in results)
    assert slowest < TIMEOUT * 1.6, results
    assert provider.calls == 1
    print(
        f"5 callers behind a hanging listing: slowest answered in {slowest:.2f}s ({TIMEOUT}s timeout)"
    )


async def test_a_failure_is_remembered_briefly_then_retried() -> None:
    provider = ListingProvider()
    registry = ProviderRegistry([provider])  # type: ignore[list-item]
    cache = ModelListCache(failure_ttl=0.3)
    with pytest.raises(UpstreamTimeout):
        await cache.get(registry, TIMEOUT)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout):
        await cache.get(registry, TIMEOUT)
    assert time.monotonic() - started < 0.05 and provider.calls == 1
    await asyncio.sleep(0.3)
    provider.hang = False
    assert b'"m"' in await cache.get(registry, TIMEOUT)
    assert provider.calls == 2


async def test_an_expired_list_is_served_while_it_is_refreshed() -> None:
    provider = ListingProvider()
    provider.hang = False
    registry = ProviderRegistry([provider])  # type: ignore[list-item]
    cache = ModelListCache(ttl=0.05)
    first = await cache.get(registry, TIMEOUT)
    await asyncio.sleep(0.06)
    provider.hang = True
    started = time.monotonic()
    assert await cache.get(registry, TIMEOUT) == first
    assert time.monotonic() - started < 0.05
    await asyncio.sleep(TIMEOUT + 0.1)  # the background refresh times out quietly
    assert await cache.get(registry, TIMEOUT) == first
