"""The asyncpg pool, and the one place database exceptions become gateway errors.

Every use of the database is bounded in time (``DATABASE_TIMEOUT_SECONDS``): a stalled server (a
stopped process, a lost network) turns into a 503 within that time, never a hang. A statement that
meets a dead connection (the server restarted while it sat idle in the pool) is retried once on a
fresh one, so the first request after a restart succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import asyncpg

from llmgw.errors import ServiceUnavailable

__all__ = [
    "API_KEY_CHANGES_CHANNEL",
    "BACKGROUND_WRITE_TIMEOUT_SECONDS",
    "DATABASE_DOWN_ERRORS",
    "DATABASE_TIMEOUT_SECONDS",
    "DEAD_CONNECTION_ERRORS",
    "BoundedPool",
    "create_pool",
    "database_errors",
    "retry_on_dead_connection",
]

T = TypeVar("T")

# The NOTIFY channel on which a trigger announces every change to api_keys (migration 0002), so
# each replica drops its cached copy of that key at once.
API_KEY_CHANGES_CHANNEL = "llmgw_api_key_changes"

# The longest any one database use may take: connecting, waiting for a pooled connection, the
# statement (or an admin transaction) and releasing the connection, all together. The hot path's
# statements take milliseconds; a database that has not answered in this time is treated as down.
DATABASE_TIMEOUT_SECONDS = 2.0
# How long asyncpg may wait, in the background, for the server to confirm a cancellation.
_CANCEL_BOUND_SECONDS = 30.0
# The bound of a background write (the usage ledger): off the request path, so generous.
BACKGROUND_WRITE_TIMEOUT_SECONDS = 30.0

# What asyncpg and the OS raise while the server is down, restarting or unreachable.
DATABASE_DOWN_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    # A server that shuts down mid-statement can leave a pooled connection in a half-finished
    # protocol state for the moment before asyncpg notices it closed; the next statement on it
    # then fails with "cannot switch to state ...; another operation is in progress".
    asyncpg.InternalClientError,
)

# A connection that died while idle (a restart, an idle timeout): worth one retry on a new one.
# Not TimeoutError: a stalled server would only be waited for twice.
DEAD_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.InternalClientError,
)


@contextmanager
def database_errors() -> Iterator[None]:
    """Turn a database outage into a 503 the client can act on."""
    try:
        yield
    except DATABASE_DOWN_ERRORS as exc:
        raise ServiceUnavailable(
            "The gateway cannot reach its database right now; retry in a few seconds."
        ) from exc


async def retry_on_dead_connection(attempt: Callable[[], Awaitable[T]], timeout: float) -> T:
    """``attempt()``, once more if it met a dead connection; both within ``timeout`` seconds.

    A statement cut off by a dying connection may have run (a write counted twice); that narrow
    window of a restart is the price of not failing the first request after every restart.
    """
    async with asyncio.timeout(timeout):
        try:
            return await attempt()
        except DEAD_CONNECTION_ERRORS:
            return await attempt()


async def _keep_session_state(_connection: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release: it is a second round trip for every query.

    llmgw never changes session state on pooled connections (no SET, LISTEN or advisory locks;
    the auth listener has a connection of its own), and asyncpg still rolls back any transaction
    left open before this hook runs.
    """


class BoundedPool(asyncpg.Pool):  # type: ignore[misc]  # asyncpg ships no type information
    """asyncpg's pool, each use bounded by ``timeout`` seconds and retried on a dead connection.

    ``async with pool.acquire()`` bounds the whole block (a transaction included), and the one-shot
    methods (``fetchrow``, ``execute``, ...) retry once on a fresh connection.
    """

    def __init__(self, *args: Any, timeout: float, **kwargs: Any) -> None:
        # asyncpg's own statement timeout only bounds what this class cannot: the cancellation
        # asyncpg sends in the background after a use was cut off.
        super().__init__(*args, timeout=timeout, command_timeout=_CANCEL_BOUND_SECONDS, **kwargs)
        self.timeout = timeout

    @asynccontextmanager
    async def _bounded_acquire(self, timeout: float) -> AsyncIterator[asyncpg.Connection]:
        # One asyncio timeout over the whole block, not asyncpg's acquire timeout: its wait_for
        # can outlast the bound while a waiter's connect attempt is being cancelled.
        async with asyncio.timeout(timeout), super().acquire() as connection:
            try:
                yield connection
            except (asyncio.CancelledError, TimeoutError):
                # Cut off mid-statement: releasing would wait for asyncpg to cancel it on the
                # server, which a stalled server never confirms. The connection is dropped.
                connection.terminate()
                raise

    def acquire(self, *, timeout: float | None = None) -> Any:
        """A connection for one ``async with`` block, bounded by ``timeout`` (default: the pool's).

        A background writer passes a longer one: cutting off a write the server may already have
        committed invites the caller to write it twice.
        """
        return self._bounded_acquire(self.timeout if timeout is None else timeout)

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        return await self._retrying(super().execute, query, *args, timeout=timeout)

    async def executemany(self, command: str, args: Any, *, timeout: float | None = None) -> None:
        await self._retrying(super().executemany, command, args, timeout=timeout)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> list[asyncpg.Record]:
        return await self._retrying(super().fetch, query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._retrying(super().fetchval, query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> asyncpg.Record | None:
        return await self._retrying(super().fetchrow, query, *args, **kwargs)

    async def _retrying(self, method: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return await retry_on_dead_connection(lambda: method(*args, **kwargs), self.timeout)


async def create_pool(
    database_url: str,
    *,
    min_size: int = 2,
    max_size: int = 10,
    timeout: float = DATABASE_TIMEOUT_SECONDS,
) -> BoundedPool:
    """A pool whose connections cache prepared statements, so each hot-path query is parsed once."""
    pool = BoundedPool(
        database_url,
        timeout=timeout,
        min_size=min_size,
        max_size=max_size,
        max_queries=50_000,
        max_inactive_connection_lifetime=300.0,
        statement_cache_size=256,
        reset=_keep_session_state,
        connection_class=asyncpg.Connection,
        record_class=asyncpg.Record,
        setup=None,
        init=None,
        connect=None,
        loop=None,
    )
    await pool
    return pool
