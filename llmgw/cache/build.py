"""The response cache the settings ask for (None: ``LLMGW_CACHE=off``)."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import metrics

from llmgw import __version__
from llmgw.cache.policy import CounterMeter, ResponseCache, alias_caches
from llmgw.cache.store import CacheStore, MemoryCacheStore
from llmgw.config import Settings

__all__ = ["build_cache"]


def build_cache(
    settings: Settings,
    *,
    clock: Callable[[], float],
    meter: CounterMeter,
    meter_provider: metrics.MeterProvider,
) -> ResponseCache | None:
    """``meter`` makes the counters (the gateway's own, cheap per point), ``meter_provider`` the
    gauge of bytes held (read only when a reader collects)."""
    if settings.cache == "off":
        return None
    evicted: list[Callable[[int], None]] = []
    store: CacheStore
    if settings.cache == "redis":
        from llmgw.cache.redis import RedisCacheStore  # the optional extra

        assert settings.redis_url is not None  # load_settings requires it
        store = RedisCacheStore(settings.redis_url)
    else:
        store = MemoryCacheStore(
            max_bytes=settings.cache_max_bytes,
            clock=clock,
            on_evict=lambda count: evicted[0](count),
        )
    cache = ResponseCache(
        store,
        ttl_seconds=settings.cache_ttl_seconds,
        max_entry_bytes=settings.cache_max_entry_bytes,
        scope=settings.cache_scope,
        clock=clock,
        aliases=alias_caches(settings.model_aliases),
        meter=meter,
        gauges=meter_provider.get_meter("llmgw", __version__),
    )
    evicted.append(cache.evictions.add)
    return cache
