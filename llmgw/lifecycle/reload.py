"""SIGHUP: read ``LLMGW_CONFIG`` again and route new requests with what it says now.

Everything derived from the file is rebuilt by :meth:`ConfigReloader.reload` and nowhere else: the
providers (each with a new session) and the model aliases; and the log redacts the credentials the
file brings from then on, as it does those of the start. A file that does not load changes nothing
and is logged. Requests already running keep the providers they started with; those providers'
sessions are closed once the last such request has finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Protocol

from aiohttp import web

from llmgw.accounting.prices import PriceTable, configured_prices, publishers
from llmgw.cache.policy import ResponseCache, alias_caches
from llmgw.config import ConfigError, Settings, load_settings
from llmgw.providers.base import Provider
from llmgw.routing.registry import ProviderRegistry, close_providers
from llmgw.telemetry.logs import redact_also

__all__ = ["RELOADER", "ConfigReloader", "RequestGenerations"]

log = logging.getLogger(__name__)


class _Generation:
    """The requests that started while one configuration was current."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.retired = False
        self.drained = asyncio.Event()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.retired and self.in_flight == 0:
            self.drained.set()


class RequestGenerations:
    """Counts running requests per configuration, so a replaced one is closed once unused."""

    def __init__(self) -> None:
        self._current = _Generation()

    def enter(self) -> _Generation:
        """A request starts: counted in the current generation until it ``leave``s that one."""
        generation = self._current
        generation.in_flight += 1
        return generation

    def advance(self) -> _Generation:
        """Start a new generation; the previous one is returned, to wait until it has drained."""
        previous, self._current = self._current, _Generation()
        previous.retired = True
        if previous.in_flight == 0:
            previous.drained.set()
        return previous


class Forgettable(Protocol):
    """What a reload leaves stale: the /v1/models listing (``llmgw.api.models.ModelListCache``).
    A protocol, not the class: lifecycle/ runs below the handlers it serves."""

    def clear(self) -> None: ...


class ConfigReloader:
    def __init__(
        self,
        registry: ProviderRegistry,
        build_registry: Callable[[Settings], Awaitable[ProviderRegistry]],
        models_cache: Forgettable,
        generations: RequestGenerations,
        prices: PriceTable | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        self._registry = registry
        self._prices = prices
        self._cache = cache
        self._build_registry = build_registry
        self._models_cache = models_cache
        self._generations = generations
        self._tasks: set[asyncio.Task[object]] = set()  # reloads, and closes of what they replaced

    def reload_soon(self) -> None:
        """SIGHUP's handler: :meth:`reload` in a task of its own (the handler cannot wait)."""
        self._track(self.reload())

    async def reload(self) -> bool:
        """Apply the configuration file as it is now; False (and a log line) if it is invalid.

        Nothing waits between reading the file and routing with it (only a failed build waits, to
        close what it built), so reloads apply in the order they were asked for."""
        try:
            settings = load_settings(require_venice_key=True)
            registry = await self._build_registry(settings)  # a plugin may refuse its entry
        except ConfigError as exc:
            log.error("configuration reload failed, the running configuration stays: %s", exc)
            return False
        redact_also(settings.secrets())  # before anything could log a new credential
        retired = self._registry.replace_with(registry)
        self._models_cache.clear()
        if self._prices is not None:
            self._prices.reconfigure(
                configured_prices(settings), publishers(self._registry.providers)
            )
        if self._cache is not None:  # what each alias says of it (cache = false, its own TTL)
            self._cache.reconfigure(alias_caches(settings.model_aliases))
        self._track(self._close_when_drained(self._generations.advance(), retired))
        log.info(
            "configuration reloaded: providers %s; model aliases %s",
            ", ".join(provider.name for provider in self._registry.providers),
            ", ".join(self._registry.aliases) or "none",
        )
        return True

    def _track(self, work: Coroutine[None, None, object]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close_when_drained(
        self, generation: _Generation, providers: tuple[Provider, ...]
    ) -> None:
        await generation.drained.wait()
        await close_providers(providers)

    async def close(self) -> None:
        """At shutdown, after the server stopped: finish the reloads under way and close what
        reloads replaced (a reload that ends meanwhile may add a close to wait for)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


RELOADER = web.AppKey("reloader", ConfigReloader)
