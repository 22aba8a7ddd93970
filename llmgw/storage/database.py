"""The asyncpg pool, and the one place database exceptions become gateway errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from llmgw.errors import ServiceUnavailable

__all__ = ["API_KEY_CHANGES_CHANNEL", "DATABASE_DOWN_ERRORS", "create_pool", "database_errors"]

# The NOTIFY channel on which a trigger announces every change to api_keys (migration 0002), so
# each replica drops its cached copy of that key at once.
API_KEY_CHANGES_CHANNEL = "llmgw_api_key_changes"

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


@contextmanager
def database_errors() -> Iterator[None]:
    """Turn a database outage into a 503 the client can act on."""
    try:
        yield
    except DATABASE_DOWN_ERRORS as exc:
        raise ServiceUnavailable(
            "The gateway cannot reach its database right now; retry in a few seconds."
        ) from exc


async def _keep_session_state(_connection: asyncpg.Connection) -> None:
    """Skip asyncpg's reset query on release: it is a second round trip for every query.

    llmgw never changes session state on pooled connections (no SET, LISTEN or advisory locks;
    the auth listener has a connection of its own), and asyncpg still rolls back any transaction
    left open before this hook runs.
    """


async def create_pool(database_url: str, *, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    """A pool whose connections cache prepared statements, so each hot-path query is parsed once."""
    pool = await asyncpg.create_pool(
        database_url,
        min_size=min_size,
        max_size=max_size,
        timeout=5.0,
        command_timeout=10.0,
        max_inactive_connection_lifetime=300.0,
        statement_cache_size=256,
        reset=_keep_session_state,
    )
    assert pool is not None
    return pool
