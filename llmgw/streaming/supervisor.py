"""The bounds every relayed stream runs under, and the streams' side of a graceful shutdown.

A stream lasts at most ``STREAM_MAX_SECONDS``. When the server begins to shut down, every open
stream's deadline is brought forward to the end of the grace (``SHUTDOWN_GRACE_SECONDS``), so a
stream still open then ends with an error event and a ``failed`` record while its caller is still
connected; aiohttp itself would only cancel the handler and close the socket. Usage drains (reading
on after the caller left, for the provider's usage) are tracked here so shutdown waits for them
before the usage ledger closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from aiohttp import web

from llmgw.errors import GatewayError, ServiceUnavailable, UpstreamTimeout

__all__ = ["STREAMS", "StreamSupervisor", "gateway_shutting_down", "install"]

log = logging.getLogger("llmgw.streaming")

# Streams end this long before the grace does, so their records are written in time.
_SHUTDOWN_MARGIN_SECONDS = 0.5


class StreamSupervisor:
    def __init__(
        self, *, max_seconds: float, max_event_bytes: int, shutdown_grace_seconds: float
    ) -> None:
        self.max_seconds = max_seconds
        self.max_event_bytes = max_event_bytes
        self._shutdown_grace = shutdown_grace_seconds
        self._shutdown_at: float | None = None
        self._open: set[asyncio.Timeout] = set()
        self._drains: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def bounded(self) -> AsyncIterator[None]:
        """Run the body until the stream's deadline; past it raise the GatewayError saying why."""
        loop = asyncio.get_running_loop()
        limit = loop.time() + self.max_seconds
        when = limit if self._shutdown_at is None else min(limit, self._shutdown_at)
        timeout = asyncio.timeout_at(when)
        try:
            async with timeout:
                self._open.add(timeout)
                yield
        except TimeoutError:
            if not timeout.expired():
                raise
            raise self._expired(loop.time() < limit) from None
        finally:
            self._open.discard(timeout)

    def _expired(self, shutting_down: bool) -> GatewayError:
        if shutting_down:
            return gateway_shutting_down()
        return UpstreamTimeout(
            f"The stream reached the gateway's maximum duration ({self.max_seconds:g} s) "
            "and was ended.",
            code="stream_max_duration",
        )

    def shutdown_cut(self) -> bool:
        """True once the grace is over: a stream cancelled now was cut by the shutdown."""
        return (
            self._shutdown_at is not None and asyncio.get_running_loop().time() >= self._shutdown_at
        )

    def begin_shutdown(self) -> None:
        when = asyncio.get_running_loop().time() + max(
            0.0, self._shutdown_grace - _SHUTDOWN_MARGIN_SECONDS
        )
        self._shutdown_at = when
        for timeout in self._open:
            deadline = timeout.when()
            if deadline is None or deadline > when:
                timeout.reschedule(when)

    def drain(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background; shutdown waits for it."""
        task = asyncio.get_running_loop().create_task(work)
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def wait_for_drains(self) -> None:
        if self._drains:
            log.info("waiting for %d stream usage drain(s)", len(self._drains))
            await asyncio.gather(*self._drains, return_exceptions=True)


def gateway_shutting_down() -> GatewayError:
    return ServiceUnavailable(
        "The gateway is shutting down; the stream was ended.", code="gateway_shutting_down"
    )


STREAMS = web.AppKey("streams", StreamSupervisor)


def install(app: web.Application, supervisor: StreamSupervisor) -> None:
    """Put the supervisor on ``app``: deadlines move at shutdown, drains end before cleanup."""
    app[STREAMS] = supervisor

    async def shutting_down(_app: web.Application) -> None:
        supervisor.begin_shutdown()

    async def drains(_app: web.Application) -> AsyncIterator[None]:
        yield
        await supervisor.wait_for_drains()

    app.on_shutdown.append(shutting_down)
    # Appended last, so it is cleaned up first: before provider sessions and the ledger close.
    app.cleanup_ctx.append(drains)
