"""The usage ledger writer: rows are queued on the request path and written in batches off it.

``record`` never blocks and never raises: a full queue drops the row and counts it
(``llmgw.usage_ledger.dropped``). A failed write keeps the batch for the next try. ``close`` writes
whatever is queued, so a graceful shutdown loses nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from llmgw.accounting.usage import UsageRecord
from llmgw.storage.database import BACKGROUND_WRITE_TIMEOUT_SECONDS, DATABASE_DOWN_ERRORS
from llmgw.storage.usage import write_batch

__all__ = ["UsageLedger"]

log = logging.getLogger(__name__)


class UsageLedger:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        capacity: int = 50_000,
        batch_size: int = 500,
        flush_interval: float = 0.5,
        on_drop: Callable[[int], None] = lambda _count: None,
    ) -> None:
        self._pool = pool
        self._capacity = capacity
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._on_drop = on_drop
        self._queue: collections.deque[UsageRecord] = collections.deque()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closing = False

    @property
    def pending(self) -> int:
        return len(self._queue)

    def record(self, record: UsageRecord) -> None:
        if len(self._queue) >= self._capacity:
            self._on_drop(1)
            log.warning("usage ledger queue is full (%d rows); a row was dropped", self._capacity)
            return
        self._queue.append(record)
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    async def start(self) -> None:
        self._writer = asyncio.create_task(self._write_forever(), name="llmgw-usage-ledger")

    async def close(self) -> None:
        # Let the writer finish its current batch rather than cancel it mid-write.
        self._closing = True
        self._wake.set()
        if self._writer is not None:
            await self._writer
        while self._queue:
            if not await self.flush():
                log.error(
                    "usage ledger: %d rows could not be written at shutdown", len(self._queue)
                )
                return

    async def flush(self) -> bool:
        """Write everything queued now; False if the database refused (rows stay queued)."""
        async with self._lock:
            while self._queue:
                batch = [
                    self._queue.popleft() for _ in range(min(self._batch_size, len(self._queue)))
                ]
                try:
                    # Not the request path's bound: a batch cut off after it committed would be
                    # queued again and written twice.
                    async with self._pool.acquire(
                        timeout=BACKGROUND_WRITE_TIMEOUT_SECONDS
                    ) as connection:
                        await write_batch(connection, batch)
                except (*DATABASE_DOWN_ERRORS, asyncpg.PostgresError) as exc:
                    self._queue.extendleft(reversed(batch))
                    log.warning("usage ledger write failed (%s); will retry", type(exc).__name__)
                    return False
                except BaseException:
                    self._queue.extendleft(reversed(batch))  # cancelled: the rows stay queued
                    raise
        return True

    async def _write_forever(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_interval)
            self._wake.clear()
            await self.flush()
