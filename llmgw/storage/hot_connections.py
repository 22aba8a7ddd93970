"""A minimal connection pool for the one statement every request runs (the rate-limit hit).

asyncpg's Pool spends ~90 µs of CPU on each acquire/release pair (timeouts, reset hooks, holder
bookkeeping), more than the statement itself. Here a connection is taken from a list and handed
back, nothing else. Connections are opened lazily up to ``size``; a broken one is dropped and
its slot reopened by the next caller, so a database restart heals without a gateway restart. Each
statement, connecting and waiting for a connection included, is bounded by ``timeout``, and retried
once on a fresh connection when the one it got had died while idle.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from typing import Any

import asyncpg

from llmgw.storage.database import DATABASE_TIMEOUT_SECONDS, retry_on_dead_connection

__all__ = ["HotConnections"]


class HotConnections:
    def __init__(
        self,
        database_url: str,
        *,
        size: int = 4,
        server_settings: Mapping[str, str] | None = None,
        timeout: float = DATABASE_TIMEOUT_SECONDS,
    ) -> None:
        self._url = database_url
        self._size = size
        self._timeout = timeout
        self._server_settings = dict(server_settings or {})
        self._idle: list[asyncpg.Connection] = []
        self._open = 0
        # A waiter gets a connection, or None: "a slot is free, open one yourself".
        self._waiters: collections.deque[asyncio.Future[asyncpg.Connection | None]] = (
            collections.deque()
        )
        self._closed = False

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await retry_on_dead_connection(lambda: self._fetchrow(query, *args), self._timeout)

    async def _fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        connection = await self._acquire()
        try:
            record: asyncpg.Record | None = await connection.fetchrow(query, *args)
        except asyncpg.PostgresError:
            self._release(connection)  # the server refused the statement; the session is fine
            raise
        except BaseException:
            # Cancelled, timed out or cut off mid-statement: the session's state is unknown, so
            # drop it (terminate: a stalled server is not waited for).
            connection.terminate()
            self._release_slot(None)
            raise
        self._release(connection)
        return record

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()

    async def _acquire(self) -> asyncpg.Connection:
        while self._idle:
            idle = self._idle.pop()
            if not idle.is_closed():
                return idle
            self._open -= 1  # the server closed it while it sat here (a restart)
        if self._open >= self._size:
            waiter: asyncio.Future[asyncpg.Connection | None] = (
                asyncio.get_running_loop().create_future()
            )
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release_slot(waiter.result())
                raise
            if handed is not None:
                return handed
        else:
            self._open += 1
        try:
            connection: asyncpg.Connection = await asyncpg.connect(
                self._url, timeout=self._timeout, server_settings=self._server_settings
            )
        except BaseException:
            self._release_slot(None)
            raise
        return connection

    def _release(self, connection: asyncpg.Connection) -> None:
        if connection.is_closed() or self._closed:
            if not connection.is_closed():
                connection.terminate()
            self._release_slot(None)
        else:
            self._release_slot(connection)

    def _release_slot(self, connection: asyncpg.Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        if connection is None:
            self._open -= 1
        else:
            self._idle.append(connection)
