"""How many calls to one provider may be in flight at once, and the short wait for a free one.

aiohttp's connector queues a request past its ``limit`` silently and without bound: a stream
beyond it got no answer head until an earlier one ended, about a minute later. Here each call
takes a slot first and holds it as long as its connection (a complete answer until it is read, a
stream until it is closed); the connector's own limit is the same number, so it never queues. A
call that finds no free slot within ``POOL_WAIT_SECONDS`` (or its deadline, if sooner) is
:class:`~llmgw.errors.UpstreamBusy`: a 503 with Retry-After, and a failure a route's fallback
moves on from, never a silent wait.
"""

from __future__ import annotations

import asyncio
import logging

from llmgw.errors import UpstreamBusy

__all__ = ["POOL_WAIT_SECONDS", "RETRY_AFTER_SECONDS", "ConnectionPool", "Slot"]

log = logging.getLogger(__name__)

# Long enough to ride out a burst of streams ending and starting, short enough that a caller
# (or the next deployment) hears about a full pool at once rather than after a stream's length.
POOL_WAIT_SECONDS = 1.0
RETRY_AFTER_SECONDS = 2
# A full pool refuses in storms: one warning per provider at most this often, with the count.
_WARN_EVERY_SECONDS = 60.0


class Slot:
    """One call's place in its provider's pool; released once, however often asked."""

    __slots__ = ("_pool",)

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool: ConnectionPool | None = pool

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.in_use -= 1
            pool._free.release()


class ConnectionPool:
    """``max_connections`` slots of one provider; ``in_use`` and ``waiting`` are for /metrics."""

    def __init__(
        self, provider: str, max_connections: int, *, wait_seconds: float = POOL_WAIT_SECONDS
    ) -> None:
        self.provider = provider
        self.max_connections = max_connections
        self._wait_seconds = wait_seconds
        self._free = asyncio.Semaphore(max_connections)
        self.in_use = 0
        self.waiting = 0
        self._refused = 0  # since the last warning
        self._warned_at: float | None = None

    async def acquire(self, deadline: float) -> Slot:
        """A slot, or :class:`UpstreamBusy` once the wait (bounded by ``deadline``, loop time)
        is over."""
        if self._free.locked():
            await self._wait_for_slot(deadline)
        else:
            await self._free.acquire()  # free: returns at once
        self.in_use += 1
        return Slot(self)

    async def _wait_for_slot(self, deadline: float) -> None:
        wait = min(self._wait_seconds, deadline - asyncio.get_running_loop().time())
        self.waiting += 1
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                await self._free.acquire()
        except TimeoutError:
            self._note_refusal()
            raise UpstreamBusy(
                f"{self.provider} is at its limit of {self.max_connections} concurrent "
                "connections (max_connections); try again shortly.",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        finally:
            self.waiting -= 1

    def _note_refusal(self) -> None:
        self._refused += 1
        now = asyncio.get_running_loop().time()
        if self._warned_at is not None and now - self._warned_at < _WARN_EVERY_SECONDS:
            return
        log.warning(
            "provider %s: all %d connections in use (max_connections); %d call(s) refused with "
            "503 upstream_busy since the last such line",
            self.provider, self.max_connections, self._refused,
        )  # fmt: skip
        self._warned_at, self._refused = now, 0
