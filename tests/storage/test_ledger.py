"""The usage ledger writer against a real Postgres: batching, outages, refused rows, precision."""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import asyncpg
import orjson
import pytest

from llmgw.accounting.usage import CostReport, UsageRecord, parse_usage
from llmgw.storage import ledger as ledger_module
from llmgw.storage.ledger import UsageLedger
from llmgw.storage.usage import write_batch
from tests.conftest import eventually
from tests.usage_records import unsanitized, usage_record


@pytest.fixture
async def pool(database_url: str, db: asyncpg.Connection) -> AsyncIterator[asyncpg.Pool]:
    """A one-connection pool on the emptied test database (``db`` empties it)."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    yield pool
    await pool.close()


def ordinary(count: int, **overrides: object) -> list[UsageRecord]:
    return [usage_record(request_id=f"ok-{index}", **overrides) for index in range(count)]


async def test_a_full_ledger_queue_drops_and_counts_and_never_blocks(pool: asyncpg.Pool) -> None:
    dropped: list[int] = []
    ledger = UsageLedger(pool, capacity=2, on_drop=dropped.append)
    for _ in range(4):
        ledger.record(usage_record())  # synchronous: a request never waits for the ledger
    assert (ledger.pending, len(dropped)) == (2, 2)


async def test_rows_stay_queued_while_the_database_does_not_answer(
    database_url: str, db: asyncpg.Connection
) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, command_timeout=0.5)
    try:
        ledger = UsageLedger(pool)
        for record in ordinary(3):
            ledger.record(record)
        # Another session holds the table: the write waits, then times out like a stalled server.
        async with db.transaction():
            await db.execute("LOCK TABLE usage_events IN ACCESS EXCLUSIVE MODE")
            assert await ledger.flush() is False
        assert ledger.pending == 3
        assert await db.fetchval("SELECT count(*) FROM usage_dead_letters") == 0
        assert await ledger.flush() is True  # the database answers again: everything is written
        assert await db.fetchval("SELECT count(*) FROM usage_events") == 3
    finally:
        await pool.close()


async def test_an_outage_logs_one_warning_when_it_starts_and_one_when_it_ends(
    database_url: str, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, command_timeout=0.3)
    try:
        ledger = UsageLedger(pool)
        ledger.record(usage_record())
        caplog.set_level("WARNING", logger=ledger_module.__name__)
        async with db.transaction():
            await db.execute("LOCK TABLE usage_events IN ACCESS EXCLUSIVE MODE")
            for _ in range(3):  # three flushes of one outage
                assert await ledger.flush() is False
        assert await ledger.flush() is True
        assert await ledger.flush() is True
        lines = [r.getMessage() for r in caplog.records if r.name == ledger_module.__name__]
        assert len(lines) == 2, lines
        assert "failed" in lines[0] and "written again" in lines[1]
    finally:
        await pool.close()


async def test_a_refused_row_is_set_aside_and_the_rest_of_its_batch_written(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    dead: list[int] = []
    ledger = UsageLedger(pool, on_dead_letter=dead.append)
    batch = ordinary(40)
    batch.insert(17, unsanitized(usage_record(request_id="bad"), status=99))
    for record in batch:
        ledger.record(record)
    assert await ledger.flush() is True
    assert ledger.pending == 0
    assert await db.fetchval("SELECT count(*) FROM usage_events") == 40
    assert await db.fetchval("SELECT count(*) FROM usage_events WHERE request_id = 'bad'") == 0
    letter = await db.fetchrow("SELECT * FROM usage_dead_letters")
    assert letter["request_id"] == "bad"
    assert letter["error_type"] == "CheckViolationError"
    assert "status_http" in letter["error_message"]
    assert orjson.loads(letter["record"])["status"] == 99
    assert dead == [1]
    # The ledger keeps writing what comes next.
    for record in ordinary(5):
        ledger.record(record)
    assert await ledger.flush() is True
    assert await db.fetchval("SELECT count(*) FROM usage_events") == 45


@pytest.mark.parametrize(
    ("field", "value", "error_type"),
    [
        ("model", "ok\x00x", "CharacterNotInRepertoireError"),
        ("response_id", "\ud800", "DataError"),  # no lone surrogate is UTF-8 (asyncpg refuses)
        ("input_tokens", 2**31, "DataError"),  # asyncpg refuses an int4 argument this large
        ("output_tokens", -1, "CheckViolationError"),
        ("cost_usd", 1e20, "NumericValueOutOfRangeError"),
        ("status", 999, "CheckViolationError"),
        ("operation", "images", "CheckViolationError"),  # an operation 0003 does not know
    ],
)
async def test_each_kind_of_refused_row_is_isolated_by_the_background_writer(
    pool: asyncpg.Pool, db: asyncpg.Connection, field: str, value: object, error_type: str
) -> None:
    dead: list[int] = []
    ledger = UsageLedger(pool, batch_size=16, flush_interval=0.05, on_dead_letter=dead.append)
    await ledger.start()
    try:
        rows = ordinary(50)
        rows.insert(
            random.randrange(50), unsanitized(usage_record(request_id="bad"), **{field: value})
        )
        for record in rows:
            ledger.record(record)
        await eventually(lambda: ledger.pending == 0 and dead == [1], within=15)
    finally:
        await ledger.close()
    assert await db.fetchval("SELECT count(*) FROM usage_events") == 50
    letter = await db.fetchrow("SELECT request_id, record, error_type FROM usage_dead_letters")
    assert (letter["request_id"], letter["error_type"]) == ("bad", error_type)
    assert (
        orjson.loads(letter["record"])["request_id"] == "bad"
    )  # readable JSON, whatever the value


async def test_usage_of_a_deleted_key_is_still_written(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    ledger = UsageLedger(pool)
    ledger.record(usage_record(api_key_id=uuid.uuid4(), input_tokens=5))  # no such key
    assert await ledger.flush() is True
    assert await db.fetchval("SELECT sum(input_tokens) FROM usage_events") == 5
    assert await db.fetchval("SELECT count(*) FROM api_key_token_windows") == 0


async def test_sums_over_the_ledger_equal_the_providers_costs_exactly(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    # Venice prices per million tokens in steps like 0.09375 USD, so its costs carry up to ~11
    # decimal places (0.00010471875). Parse them as the gateway does (orjson: floats).
    rng = random.Random(11)
    subject = uuid.uuid4()
    written: list[str] = []
    ledger = UsageLedger(pool)
    for index in range(2000):
        prompt, completion = rng.randrange(1, 5000), rng.randrange(1, 2000)
        cost = (
            Decimal(prompt) * Decimal("0.09375") / 10**6
            + Decimal(completion) * Decimal("0.25") / 10**6
        )
        text = f'{{"usage": {{"prompt_tokens": {prompt}, "completion_tokens": {completion}}}, "cost": {{"usd": {cost}, "diem": {cost}}}}}'
        written.append(str(cost))
        usage = parse_usage(orjson.loads(text), cost=CostReport("venice.cost"))
        assert usage is not None
        ledger.record(
            usage_record(
                request_id=f"r{index}",
                subject_id=subject,
                cost_usd=usage.cost_usd,
                provider_extras=usage.extras,
            )
        )
    assert await ledger.flush() is True
    expected = sum(Decimal(cost) for cost in written)
    assert await db.fetchval("SELECT sum(cost_usd) FROM usage_events") == expected
    assert (
        await db.fetchval(
            "SELECT sum((provider_extras ->> 'venice.cost.diem')::numeric) FROM usage_events"
        )
        == expected
    )
    assert await db.fetchval(
        "SELECT llmgw_extras_sum(provider_extras) ->> 'venice.cost.diem' FROM usage_events"
    ) == str(expected)
    assert await db.fetchval("SELECT spend_usd FROM subject_monthly_spend") == expected
    assert await db.fetchval(
        "SELECT cost_usd FROM usage_events WHERE request_id = 'r0'"
    ) == Decimal(written[0])


async def test_a_flush_under_steady_load_commits_one_transaction_per_batch_queued_when_it_began(
    pool: asyncpg.Pool, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows keep arriving while a batch is written: they wait for the next flush, so a flush
    commits one transaction per full batch (and one for the rest) of what was queued when it
    began, never one small transaction after another while requests keep coming."""
    ledger = UsageLedger(pool, batch_size=4)
    arrivals = iter(ordinary(60, api_key_id=uuid.uuid4()))
    transactions: list[int] = []

    async def counted(connection: asyncpg.Connection, records: list[UsageRecord]) -> None:
        transactions.append(len(records))
        await write_batch(connection, records)
        for record in itertools.islice(arrivals, 3):  # a steady load: rows queued meanwhile
            ledger.record(record)

    monkeypatch.setattr(ledger_module, "write_batch", counted)
    for index in range(10):
        ledger.record(usage_record(request_id=f"first-{index}"))
    assert await ledger.flush() is True
    assert transactions == [4, 4, 2]
    assert ledger.pending == 9  # what arrived meanwhile is the next flush's
    assert await db.fetchval("SELECT count(*) FROM usage_events") == 10
    assert await ledger.flush() is True
    assert transactions[3:] == [4, 4, 1]
