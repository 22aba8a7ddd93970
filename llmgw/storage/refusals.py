"""Requests the gateway refused itself, counted per minute, route, status and code for the console.

A refused request (401, 403, 413, 429, the gateway's own 400s) never reaches a provider, so the
usage ledger has no row of it; without this the console's error counts would miss exactly the
refusals an operator is looking for. Counting costs a dict increment on the request path; a
background task adds the counts to ``refusals_by_minute`` every ``flush_interval`` seconds, one
upsert per minute, route, status and code, so a storm of refusals costs the database a few rows,
not a write per request. While the database is unreachable the counts are kept (a bounded number of
distinct rows; beyond it new ones are dropped and logged) and added at the next flush; ``close``
flushes what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg

from llmgw.storage.database import BACKGROUND_WRITE_TIMEOUT_SECONDS, DATABASE_DOWN_ERRORS

__all__ = ["RefusalCounts", "refusals_since"]

log = logging.getLogger(__name__)

_UPSERT = """
INSERT INTO refusals_by_minute AS r (minute, route, status, code, requests)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (minute, route, status, code) DO UPDATE SET requests = r.requests + excluded.requests
"""
# Distinct (minute, route, status, code) counts kept while the database is away: routes are route
# templates and codes the gateway's own, so this holds hours of a storm.
_MAX_PENDING = 10_000

_Cell = tuple[int, str, int, str]  # minute (epoch seconds), route, status, code


class RefusalCounts:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        flush_interval: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = pool
        self._flush_interval = flush_interval
        self._clock = clock
        self._pending: dict[_Cell, int] = {}
        self._lock = asyncio.Lock()
        self._writer: asyncio.Task[None] | None = None
        self._dropped = 0

    def count(self, route: str, status: int, code: str) -> None:
        """Never blocks, never raises: a dict increment."""
        cell = (int(self._clock()) // 60 * 60, route, status, code)
        if cell not in self._pending and len(self._pending) >= _MAX_PENDING:
            self._dropped += 1
            return
        self._pending[cell] = self._pending.get(cell, 0) + 1

    async def start(self) -> None:
        self._writer = asyncio.create_task(self._write_forever(), name="llmgw-refusal-counts")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if not await self.flush() and self._pending:
            log.warning(
                "refusal counts: %d rows could not be written at shutdown", len(self._pending)
            )

    async def flush(self) -> bool:
        """Add what was counted to the table; False if the database was unreachable (kept)."""
        async with self._lock:
            if self._dropped:
                log.warning(
                    "refusal counts: %d refusals were not counted (too many kept)", self._dropped
                )
                self._dropped = 0
            if not self._pending:
                return True
            batch, self._pending = self._pending, {}
            rows = [
                (datetime.fromtimestamp(minute, UTC), route, status, code, requests)
                for (minute, route, status, code), requests in sorted(batch.items())
            ]
            try:
                async with self._pool.acquire(timeout=BACKGROUND_WRITE_TIMEOUT_SECONDS) as conn:
                    await conn.executemany(_UPSERT, rows)
            except (*DATABASE_DOWN_ERRORS, asyncpg.PostgresError) as exc:
                self._keep(batch)
                log.warning("refusal counts write failed (%s); will retry", type(exc).__name__)
                return False
            except BaseException:
                self._keep(batch)
                raise
        return True

    def _keep(self, batch: dict[_Cell, int]) -> None:
        for cell, requests in batch.items():
            self._pending[cell] = self._pending.get(cell, 0) + requests

    async def _write_forever(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval)
            try:
                await self.flush()
            except Exception:
                log.exception("refusal counts write failed unexpectedly; will retry")


async def refusals_since(conn: asyncpg.Connection, since: datetime) -> list[dict[str, Any]]:
    """Refusals from ``since`` (to the minute) on, per status and code, most first."""
    rows = await conn.fetch(
        """
        SELECT status, code, sum(requests)::bigint AS requests FROM refusals_by_minute
        WHERE minute >= $1 GROUP BY status, code ORDER BY requests DESC, status, code
        """,
        since,
    )
    return [dict(row) for row in rows]
