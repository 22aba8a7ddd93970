"""The ledger's spool: rows of a process killed before writing them are written by the next one,
each once, and a live process's spool is never taken."""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from llmgw.accounting.usage import UsageRecord
from llmgw.storage import ledger as ledger_module
from llmgw.storage.ledger import UsageLedger
from llmgw.storage.spool import Spool, from_line, to_line
from llmgw.storage.usage import write_batch
from tests.processes import eventually
from tests.usage_records import usage_record

SUBJECT = uuid.UUID(int=7)

# A process that spools the records given as lines on stdin, then is killed outright.
_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from llmgw.storage.spool import Spool, from_line
spool = Spool.open(Path(sys.argv[1]))
for line in sys.stdin.buffer:
    spool.append(from_line(line))
os.kill(os.getpid(), signal.SIGKILL)
"""


def files(directory: Path, pattern: str) -> list[str]:
    return sorted(path.name for path in directory.glob(pattern))


def spooled_rows(directory: Path) -> int:
    return sum(len(path.read_bytes().splitlines()) for path in directory.glob("*.jsonl"))


@pytest.fixture
async def pool(database_url: str, db: asyncpg.Connection) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    yield pool
    await pool.close()


def test_a_record_reads_back_as_written() -> None:
    record = usage_record(subject_id=SUBJECT, cost_usd=0.00010471875, flags=("model:truncated",))
    assert from_line(to_line(record)) == record
    # Accounting hands over the fields it made for the billing line: the same line.
    assert to_line(record, record.log_fields()) == to_line(record)


def test_a_line_spooled_before_provider_extras_keeps_its_diem_cost() -> None:
    record = usage_record(provider_extras={"venice.cost.diem": 0.5})
    line = to_line(record).replace(
        b'"provider_extras":{"venice.cost.diem":0.5}', b'"cost_diem":0.5'
    )
    assert b"provider_extras" not in line
    assert from_line(line) == record
    older = to_line(usage_record()).replace(b'"provider_extras":{}', b'"cost_diem":null')
    assert from_line(older).provider_extras == {}


async def test_the_rows_of_a_killed_process_are_written_once_by_the_next(
    tmp_path: Path, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    records = [usage_record(request_id=f"r{i}", subject_id=SUBJECT, cost_usd=0.5) for i in range(5)]
    killed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_WRITER, str(tmp_path), stdin=asyncio.subprocess.PIPE
    )
    await killed.communicate(b"".join(map(to_line, records)))
    assert killed.returncode == -9
    async with pool.acquire() as connection:
        await write_batch(connection, records[:2])  # it had written these before it was killed
    ledger = UsageLedger(pool, spool=Spool.open(tmp_path))
    await ledger.start()
    await ledger.close()
    rows = await db.fetch("SELECT request_id FROM usage_events ORDER BY request_id")
    assert [row["request_id"] for row in rows] == ["r0", "r1", "r2", "r3", "r4"]
    spend = await db.fetchval("SELECT spend_usd FROM subject_monthly_spend")
    assert spend == Decimal("2.5")  # the two rows written before were not counted again
    assert files(tmp_path, "*") == []  # all written: nothing kept


async def test_a_replay_that_meets_a_batch_still_committing_counts_each_row_once(
    tmp_path: Path, pool: asyncpg.Pool, db: asyncpg.Connection, database_url: str
) -> None:
    records = [usage_record(request_id=f"r{i}", subject_id=SUBJECT, cost_usd=0.5) for i in range(4)]
    stalled = await asyncpg.connect(database_url)  # a batch whose commit has not come back yet
    try:
        transaction = stalled.transaction()
        await transaction.start()
        await write_batch(stalled, records)
        spool = Spool.open(tmp_path)
        assert spool is not None
        for record in records:  # the same rows, spooled by the process that wrote them
            spool.append(record)
        spool.close(empty=False)
        ledger = UsageLedger(pool, spool=Spool.open(tmp_path))
        await ledger.start()  # adopts them
        replay = asyncio.create_task(ledger.flush())
        waiting = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        await eventually(lambda: db.fetchval(waiting), what="the replay waits on the batch")
        await transaction.commit()
        assert await replay
        await ledger.close()
    finally:
        await stalled.close()
    assert await db.fetchval("SELECT count(*) FROM usage_events") == 4
    assert await db.fetchval("SELECT spend_usd FROM subject_monthly_spend") == Decimal("2.0")
    assert await db.fetchval("SELECT sum(requests) FROM usage_hourly") == 4


async def test_the_spool_stays_bounded_while_the_database_takes_only_some_batches(
    tmp_path: Path,
    pool: asyncpg.Pool,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An overloaded database times out every other batch: no flush writes all it began with, for
    as long as that lasts. The spool keeps the rows still queued and at most one flush's worth more,
    never every row since the last flush that wrote everything; rows past the queue's capacity are
    dropped, counted, and said once."""
    dropped: list[int] = []
    ledger = UsageLedger(
        pool, capacity=8, batch_size=2, on_drop=dropped.append, spool=Spool.open(tmp_path)
    )
    batches = itertools.count()

    async def overloaded(connection: asyncpg.Connection, records: list[UsageRecord]) -> None:
        if next(batches) % 2:
            raise TimeoutError
        await write_batch(connection, records)

    monkeypatch.setattr(ledger_module, "write_batch", overloaded)
    for flush in range(20):
        for index in range(4):
            ledger.record(usage_record(request_id=f"{flush}-{index}"))
        assert await ledger.flush() is False
        assert spooled_rows(tmp_path) <= 2 * 8, f"after flush {flush}"
    assert sum(dropped) > 0
    assert caplog.text.count("usage ledger queue is full") == 1
    monkeypatch.setattr(ledger_module, "write_batch", write_batch)  # it recovers
    await ledger.close()
    assert await db.fetchval("SELECT count(*) FROM usage_events") == 80 - sum(dropped)
    assert files(tmp_path, "*") == []


async def test_a_live_process_keeps_its_spool_and_a_clean_stop_leaves_none(
    tmp_path: Path, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    live = Spool.open(tmp_path)
    assert live is not None
    live.append(usage_record(request_id="theirs"))
    ledger = UsageLedger(pool, spool=Spool.open(tmp_path))
    await ledger.start()
    ledger.record(usage_record(request_id="mine"))
    await ledger.close()
    rows = await db.fetch("SELECT request_id FROM usage_events")
    assert [row["request_id"] for row in rows] == ["mine"]
    live.close(empty=False)  # as if it stopped with the row unwritten: the next start takes it
    assert len(files(tmp_path, "*.jsonl")) == 1


def test_a_spool_that_cannot_be_made_is_none_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    assert Spool.open(tmp_path / "file" / "spool") is None
    assert "rows not yet written are lost if this process is killed" in caplog.text
