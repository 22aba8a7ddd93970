"""The usage ledger writer: rows are queued on the request path and written in batches off it.

``record`` never blocks and never raises: a full queue drops the row and counts it
(``llmgw.usage_ledger.dropped``). While the database is unreachable a batch stays queued for the
next try. A batch the database refuses for what is in it is split in halves until the refused row
is alone; that row is set aside in ``usage_dead_letters`` (an ERROR line, and counted in
``llmgw.usage_ledger.dead_letters``) and every other row is written, so one bad row never stops
the ledger. ``close`` writes whatever is queued, so a graceful shutdown loses nothing; with a
:class:`~llmgw.storage.spool.Spool`, neither does a process killed outright: each queued row is in
its spool file too, and the next process to start writes the rows of processes that are gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from llmgw.accounting.usage import UsageRecord
from llmgw.storage.database import BACKGROUND_WRITE_TIMEOUT_SECONDS, DATABASE_DOWN_ERRORS
from llmgw.storage.spool import Spool
from llmgw.storage.usage import dead_letter_json, set_aside, write_batch

__all__ = ["UsageLedger"]

log = logging.getLogger(__name__)

# The rows themselves were refused, so the same rows would be refused again: data exceptions
# (SQLSTATE class 22), constraint violations (23), limits (54), and asyncpg's own refusal to encode
# an argument (a ValueError, although it also derives from InterfaceError, a DATABASE_DOWN_ERROR).
_ROWS_REFUSED: tuple[type[Exception], ...] = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
    ValueError,
    TypeError,
    OverflowError,
)


class UsageLedger:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        capacity: int = 50_000,
        batch_size: int = 500,
        flush_interval: float = 0.5,
        on_drop: Callable[[int], None] = lambda _count: None,
        on_dead_letter: Callable[[int], None] = lambda _count: None,
        spool: Spool | None = None,
    ) -> None:
        self._pool = pool
        self._spool = spool
        self._capacity = capacity
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._on_drop = on_drop
        self._on_dead_letter = on_dead_letter
        self._queue: collections.deque[UsageRecord] = collections.deque()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closing = False
        self._dropping = False  # said once, until a flush writes everything it began with
        self._failing_since: float | None = None  # a write failed: said once, until one works
        # The queue keeps the order rows were taken (and spooled) in, and rows leave it from the
        # front: rows written so far are the first ``_done`` of the ``_taken``. A segment closed
        # when ``_taken`` was n holds none of the rows after n, so it goes once ``_done`` >= n,
        # also when a flush wrote only some of its batches: the spool never holds much more than
        # the queue (at most the rows of the oldest segment already written).
        self._taken = 0
        self._done = 0
        self._segments: collections.deque[tuple[int, int]] = collections.deque()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def record(self, record: UsageRecord, fields: dict[str, Any] | None = None) -> None:
        """Queue ``record``; ``fields``: its ``log_fields()``, when the caller made them already."""
        if len(self._queue) >= self._capacity:
            self._on_drop(1)
            if not self._dropping:
                log.warning(
                    "usage ledger queue is full (%d rows): rows are dropped (counted in "
                    "llmgw.usage_ledger.dropped) until the database has taken what is queued",
                    self._capacity,
                )
            self._dropping = True
            return
        self._take(record, fields)
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    def _take(self, record: UsageRecord, fields: dict[str, Any] | None = None) -> None:
        self._queue.append(record)
        self._taken += 1
        if self._spool is not None:
            self._spool.append(record, fields)

    async def start(self) -> None:
        if self._spool is not None and (adopted := self._spool.adopt(self._take)):
            log.warning(
                "usage ledger: %d rows of a process that stopped before writing them (killed?) "
                "were found in its spool; they are written now (rows it had written are skipped)",
                adopted,
            )
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
                    "usage ledger: %d rows could not be written at shutdown%s",
                    len(self._queue),
                    "" if self._spool is None else "; the next start writes them from the spool",
                )
                break
        if self._spool is not None:
            self._spool.close(empty=not self._queue)

    async def flush(self) -> bool:
        """Write the rows queued when it began, one transaction per full batch and one for the rest;
        False if the database was unreachable (rows stay queued).

        Rows queued while it writes wait for the next flush: looping until the queue is empty
        would, under steady load, commit many small transactions a second instead of one a
        flush interval (or a full batch).
        """
        async with self._lock:
            if self._spool is not None and self._queue:
                self._segments.append((self._spool.rotate(), self._taken))
            left = len(self._queue)
            while left:
                count = min(self._batch_size, left)
                left -= count
                # Parts still to write, the next one last; a refused part is replaced by its halves.
                parts = [[self._queue.popleft() for _ in range(count)]]
                try:
                    # Not the request path's bound: a batch cut off after it committed would be
                    # queued again and written twice.
                    async with self._pool.acquire(
                        timeout=BACKGROUND_WRITE_TIMEOUT_SECONDS
                    ) as connection:
                        await self._write(connection, parts)
                except (*DATABASE_DOWN_ERRORS, asyncpg.PostgresError) as exc:
                    self._put_back(parts)
                    if self._failing_since is None:  # once an outage, not once a flush
                        self._failing_since = time.monotonic()
                        log.warning(
                            "usage ledger write failed (%s); rows stay queued and are retried "
                            "every flush until the database takes them",
                            type(exc).__name__,
                        )
                    self._discard_written()
                    if self._spool is not None and self._segments:
                        # They may wait a while: on disk, they survive the machine too.
                        await asyncio.to_thread(self._spool.sync, self._segments[-1][0])
                    return False
                except BaseException:
                    self._put_back(parts)  # cancelled: the rows stay queued
                    raise
            self._discard_written()
            self._dropping = False
            if self._failing_since is not None:
                log.warning(
                    "usage ledger rows are written again after %.1f s of failed writes",
                    time.monotonic() - self._failing_since,
                )
                self._failing_since = None
        return True

    def _discard_written(self) -> None:
        through = None
        while self._segments and self._segments[0][1] <= self._done:
            through, _ = self._segments.popleft()
        if self._spool is not None and through is not None:
            self._spool.discard(through)

    async def _write(self, connection: asyncpg.Connection, parts: list[list[UsageRecord]]) -> None:
        while parts:
            part = parts[-1]
            try:
                await write_batch(connection, part)
            except _ROWS_REFUSED as exc:
                if len(part) > 1:
                    middle = len(part) // 2
                    parts[-1:] = [part[middle:], part[:middle]]
                    continue
                await self._set_aside(connection, part[0], exc)
            self._done += len(parts.pop())

    async def _set_aside(
        self, connection: asyncpg.Connection, record: UsageRecord, error: Exception
    ) -> None:
        try:
            await set_aside(connection, record, error)
        except _ROWS_REFUSED as exc:
            self._on_dead_letter(1)
            log.error(
                "usage ledger: the database refused the row of request %s (%s: %s) and its "
                "dead letter too (%s); the row is only in this line: %s",
                record.request_id, type(error).__name__, error, type(exc).__name__,
                dead_letter_json(record),
            )  # fmt: skip
            return
        self._on_dead_letter(1)
        log.error(
            "usage ledger: the database refused the row of request %s (%s: %s); it is kept in "
            "usage_dead_letters and the other rows are written",
            record.request_id, type(error).__name__, error,
        )  # fmt: skip

    def _put_back(self, parts: list[list[UsageRecord]]) -> None:
        for part in parts:  # the last part goes back first in the queue
            self._queue.extendleft(reversed(part))

    async def _write_forever(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_interval)
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                # The rows are back in the queue; a writer that died here would stop the ledger.
                log.exception("usage ledger write failed unexpectedly; will retry")
