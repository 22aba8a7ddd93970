"""Fixed windows in ``api_key_rate_limit_windows``: one statement per request, exact under concurrency.

``INSERT … ON CONFLICT DO UPDATE … WHERE request_count < limit`` takes the window row's lock, so
concurrent requests on any number of replicas are serialised by Postgres and exactly ``limit`` of
them see a row come back. Window boundaries use the database clock, so replicas agree on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.ratelimit.base import RateLimitDecision
from llmgw.storage.database import DATABASE_DOWN_ERRORS, database_errors
from llmgw.storage.hot_connections import HotConnections

__all__ = ["PostgresRateLimiter"]

log = logging.getLogger(__name__)

_HIT = """
WITH clock AS (
    SELECT extract(epoch FROM clock_timestamp()) AS now_epoch
), window_bounds AS (
    SELECT to_timestamp(floor(now_epoch / $2::integer) * $2::integer) AS start_at,
           floor(now_epoch / $2::integer) * $2::integer + $2::integer - now_epoch AS reset_seconds
    FROM clock
), counted AS (
    INSERT INTO api_key_rate_limit_windows AS w
        (api_key_id, window_start_at, window_seconds, request_count)
    SELECT $1::uuid, start_at, $2::integer, 1 FROM window_bounds
    ON CONFLICT (api_key_id, window_start_at, window_seconds)
    DO UPDATE SET request_count = w.request_count + 1 WHERE w.request_count < $3::integer
    RETURNING request_count
)
SELECT (SELECT request_count FROM counted) AS request_count,
       (SELECT reset_seconds FROM window_bounds)::float8 AS reset_seconds
"""

_PRUNE = """
DELETE FROM api_key_rate_limit_windows
WHERE window_start_at + make_interval(secs => window_seconds) < now() - interval '1 minute'
"""


class PostgresRateLimiter:
    def __init__(
        self, pool: asyncpg.Pool, database_url: str, *, prune_interval: float = 60.0
    ) -> None:
        self._pool = pool
        # The hit runs on connections of its own: a lean pool, and no wait for the WAL flush.
        # A counter lost in a database crash only forgives a few requests; latency is paid by all.
        self._connections = HotConnections(
            database_url, size=4, server_settings={"synchronous_commit": "off"}
        )
        self._prune_interval = prune_interval
        self._pruner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._pruner = asyncio.create_task(self._prune_forever(), name="llmgw-ratelimit-prune")

    async def close(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
        await self._connections.close()

    async def hit(self, key: AuthenticatedKey) -> RateLimitDecision:
        limit = key.rate_limit_requests
        with database_errors():
            row = await self._connections.fetchrow(
                _HIT, key.id, key.rate_limit_window_seconds, limit
            )
        assert row is not None
        count: int | None = row["request_count"]
        reset: float = row["reset_seconds"]
        if count is None:
            return RateLimitDecision(allowed=False, limit=limit, remaining=0, reset_seconds=reset)
        return RateLimitDecision(
            allowed=True, limit=limit, remaining=limit - count, reset_seconds=reset
        )

    async def prune(self) -> int:
        """Delete windows that ended over a minute ago; returns how many."""
        status: str = await self._pool.execute(_PRUNE)
        return int(status.rsplit(" ", 1)[-1])

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(self._prune_interval)
            try:
                await self.prune()
            except DATABASE_DOWN_ERRORS as exc:
                log.warning("rate-limit window pruning skipped: %s", type(exc).__name__)
