"""The schema: every invariant is a database constraint, and migrations match the metadata."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from llmgw.key_format import hash_key
from llmgw.storage import console_sessions, migrations, revisions
from llmgw.storage.schema import metadata

NOW = datetime.now(UTC)
GOOD = {
    "name": "k",
    "prefix": "llmg_abcdefg",
    "key_hash": hash_key("llmg_abcdefg-rest"),
}


async def insert_key(db: asyncpg.Connection, **overrides: object) -> uuid.UUID:
    values = {**GOOD, **overrides}
    columns = ", ".join(values)
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    key_id: uuid.UUID = await db.fetchval(
        f"INSERT INTO api_keys ({columns}) VALUES ({placeholders}) RETURNING id", *values.values()
    )
    return key_id


async def test_a_valid_key_row_is_accepted_with_defaults(db: asyncpg.Connection) -> None:
    key_id = await insert_key(db)
    row = await db.fetchrow("SELECT * FROM api_keys WHERE id = $1", key_id)
    assert (row["rate_limit_requests"], row["rate_limit_window_seconds"]) == (60, 60)
    assert row["is_active"] is True
    assert row["created_at"] is not None


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"prefix": "llmg_short"}, asyncpg.CheckViolationError),
        ({"prefix": "llmg_toolong12"}, asyncpg.StringDataRightTruncationError),
        ({"key_hash": b"\x00" * 31}, asyncpg.CheckViolationError),
        ({"key_hash": b"\x00" * 33}, asyncpg.CheckViolationError),
        ({"rate_limit_requests": 0}, asyncpg.CheckViolationError),
        ({"rate_limit_window_seconds": -1}, asyncpg.CheckViolationError),
        ({"revoked_at": NOW}, asyncpg.CheckViolationError),
        ({"name": None}, asyncpg.NotNullViolationError),
        ({"max_concurrent_requests": 0}, asyncpg.CheckViolationError),
    ],
)
async def test_impossible_key_rows_are_rejected(
    db: asyncpg.Connection, overrides: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await insert_key(db, **overrides)


async def test_prefix_and_hash_are_unique(db: asyncpg.Connection) -> None:
    await insert_key(db)
    with pytest.raises(asyncpg.UniqueViolationError):
        await insert_key(db, key_hash=hash_key("other"))
    with pytest.raises(asyncpg.UniqueViolationError):
        await insert_key(db, prefix="llmg_zzzzzzz")


async def test_revoked_at_is_allowed_once_inactive(db: asyncpg.Connection) -> None:
    await insert_key(db, is_active=False, revoked_at=NOW)


@pytest.mark.parametrize(
    ("window_seconds", "request_count", "error"),
    [
        (0, 1, asyncpg.CheckViolationError),
        (60, -1, asyncpg.CheckViolationError),
    ],
)
async def test_impossible_windows_are_rejected(
    db: asyncpg.Connection, window_seconds: int, request_count: int, error: type[Exception]
) -> None:
    key_id = await insert_key(db)
    with pytest.raises(error):
        await db.execute(
            "INSERT INTO api_key_rate_limit_windows VALUES ($1, now(), $2, $3)",
            key_id,
            window_seconds,
            request_count,
        )


async def test_window_needs_an_existing_key_and_is_unique(db: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await db.execute(
            "INSERT INTO api_key_rate_limit_windows VALUES ($1, now(), 60, 1)", uuid.uuid4()
        )
    key_id = await insert_key(db)
    await db.execute(
        "INSERT INTO api_key_rate_limit_windows VALUES ($1, '2026-01-01', 60, 1)", key_id
    )
    with pytest.raises(asyncpg.UniqueViolationError):
        await db.execute(
            "INSERT INTO api_key_rate_limit_windows VALUES ($1, '2026-01-01', 60, 2)", key_id
        )


async def test_metadata_matches_the_migrations(database_url: str) -> None:
    engine = create_async_engine(migrations.sqlalchemy_url(database_url))
    try:
        async with engine.connect() as connection:
            differences = await connection.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}), metadata
                )
            )
    finally:
        await engine.dispose()
    assert differences == []


async def test_downgrade_to_base_then_upgrade_to_head_round_trips(empty_database: str) -> None:
    await asyncio.to_thread(migrations.upgrade, empty_database)
    await asyncio.to_thread(migrations.downgrade, empty_database, "base")
    connection = await asyncpg.connect(empty_database)
    try:
        assert await connection.fetchval("SELECT to_regclass('api_keys')") is None
        await asyncio.to_thread(migrations.upgrade, empty_database)
        assert await revisions.current_revision(connection) == migrations.head_revision()
    finally:
        await connection.close()


def test_the_light_head_revision_agrees_with_alembic() -> None:
    assert revisions.head_revision() == migrations.head_revision()


def test_serving_does_not_load_alembic_or_sqlalchemy() -> None:
    # They cost ~44 MiB per replica; migrations run in `llmgw db upgrade`, another process.
    code = "import sys, llmgw.cli, llmgw.app; print(sorted(m for m in ('alembic', 'sqlalchemy') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


USAGE_ROW = {
    "api_key_id": uuid.uuid4(),
    "request_id": "r",
    "operation": "chat",
    "provider": "venice",
    "model": "m",
    "stream": False,
    "status": 200,
    "duration_ms": 1.0,
}


async def insert_usage(db: asyncpg.Connection, **overrides: object) -> asyncpg.Record:
    values = {**USAGE_ROW, **overrides}
    columns = ", ".join(values)
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    row: asyncpg.Record = await db.fetchrow(
        f"INSERT INTO usage_events ({columns}) VALUES ({placeholders}) RETURNING *",
        *values.values(),
    )
    return row


async def test_a_usage_row_defaults_to_reported_and_unflagged(db: asyncpg.Connection) -> None:
    row = await insert_usage(db)
    assert (row["usage_source"], row["flags"]) == ("reported", [])


async def test_costs_keep_eighteen_decimal_places_and_status_may_be_dropped(
    db: asyncpg.Connection,
) -> None:
    cost = Decimal("0.000104718750000001")
    row = await insert_usage(db, cost_usd=cost, saved_cost_usd=cost, status=None)
    assert (row["cost_usd"], row["saved_cost_usd"], row["status"]) == (cost, cost, None)
    subject = uuid.uuid4()
    await db.execute(
        "INSERT INTO subject_monthly_spend (subject_id, month, spend_usd) VALUES ($1, $2, $3)",
        subject,
        NOW.date().replace(day=1),
        cost,
    )
    assert await db.fetchval("SELECT spend_usd FROM subject_monthly_spend") == cost


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"usage_source": "guessed"}, asyncpg.CheckViolationError),
        ({"usage_source": None}, asyncpg.NotNullViolationError),
        ({"flags": [""]}, asyncpg.CheckViolationError),
        ({"flags": ["model:truncated", None]}, asyncpg.CheckViolationError),
        ({"flags": None}, asyncpg.NotNullViolationError),
        ({"status": 999}, asyncpg.CheckViolationError),
        ({"cost_usd": Decimal(10**12)}, asyncpg.NumericValueOutOfRangeError),
        ({"provider_extras": "[1]"}, asyncpg.CheckViolationError),
        ({"provider_extras": None}, asyncpg.NotNullViolationError),
    ],
)
async def test_impossible_usage_rows_are_rejected(
    db: asyncpg.Connection, overrides: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await insert_usage(db, **overrides)


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (("r", "{}", "", "m"), asyncpg.CheckViolationError),
        (("r", "", "CheckViolationError", "m"), asyncpg.CheckViolationError),
        (("r", None, "CheckViolationError", "m"), asyncpg.NotNullViolationError),
        (("r", "{}", "CheckViolationError", None), asyncpg.NotNullViolationError),
    ],
)
async def test_impossible_dead_letters_are_rejected(
    db: asyncpg.Connection, values: tuple[object, ...], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await db.execute(
            "INSERT INTO usage_dead_letters (request_id, record, error_type, error_message) "
            "VALUES ($1, $2, $3, $4)",
            *values,
        )


async def test_0004_keeps_the_ledger_rows_of_0003_and_back(empty_database: str) -> None:
    await asyncio.to_thread(migrations.upgrade, empty_database, "0004")
    connection = await asyncpg.connect(empty_database)
    try:
        await insert_usage(connection, cost_usd=Decimal("0.00000001"))
        await asyncio.to_thread(migrations.upgrade, empty_database, "0004")
        row = await connection.fetchrow("SELECT * FROM usage_events")
        assert (row["cost_usd"], row["usage_source"], row["flags"]) == (
            Decimal("0.00000001"),
            "reported",
            [],
        )
        await insert_usage(connection, status=None, cost_usd=Decimal("0.00010471875"))
        await asyncio.to_thread(migrations.downgrade, empty_database, "0003")
        rows = await connection.fetch("SELECT status, cost_usd FROM usage_events ORDER BY id")
        assert [(r["status"], r["cost_usd"]) for r in rows] == [
            (200, Decimal("0.00000001")),
            (502, Decimal("0.00010472")),  # 0003 keeps 8 places
        ]
    finally:
        await connection.close()


async def test_0022_moves_the_diem_cost_into_provider_extras_and_back(empty_database: str) -> None:
    await asyncio.to_thread(migrations.upgrade, empty_database, "0021")
    connection = await asyncpg.connect(empty_database)
    diem = Decimal("0.000104718750000001")
    hourly = (
        "INSERT INTO usage_hourly (hour, api_key_id, model, requests, errors, input_tokens, "
        "output_tokens, cost_usd, cost_diem, duration_ms_sum, latency_buckets) "
        "VALUES (date_trunc('hour', now()), $1, $2, 1, 0, 1, 1, 0, $3, 1, '{1}')"
    )
    try:
        await insert_usage(connection, request_id="diem", cost_diem=diem)
        await insert_usage(connection, request_id="none")
        await connection.execute(hourly, uuid.uuid4(), "diem", diem)
        await connection.execute(hourly, uuid.uuid4(), "none", 0)
        await asyncio.to_thread(migrations.upgrade, empty_database, "0022")
        rows = await connection.fetch(
            "SELECT request_id, provider_extras::text AS extras FROM usage_events ORDER BY id"
        )
        moved = '{"venice.cost.diem": 0.000104718750000001}'
        assert [(r["request_id"], r["extras"]) for r in rows] == [("diem", moved), ("none", "{}")]
        rows = await connection.fetch(
            "SELECT model, provider_extras::text AS extras FROM usage_hourly ORDER BY model"
        )
        assert [(r["model"], r["extras"]) for r in rows] == [
            ("diem", '{"venice.cost.diem": 0.000104718750000001}'),
            ("none", "{}"),
        ]
        # Summed by name, exactly; and a row of today's code with another provider's extras.
        added = await connection.fetchval(
            'SELECT llmgw_extras_add($1::jsonb, \'{"venice.cost.diem": 1, "p.x": 2}\')::text',
            moved,
        )
        assert added == '{"p.x": 2, "venice.cost.diem": 1.000104718750000001}'
        await insert_usage(connection, request_id="new", provider_extras='{"p.x": 1}')
        await asyncio.to_thread(migrations.downgrade, empty_database, "0021")
        rows = await connection.fetch("SELECT request_id, cost_diem FROM usage_events ORDER BY id")
        assert [(r["request_id"], r["cost_diem"]) for r in rows] == [
            ("diem", diem),
            ("none", None),
            ("new", None),
        ]
        rows = await connection.fetch("SELECT model, cost_diem FROM usage_hourly ORDER BY model")
        assert [(r["model"], r["cost_diem"]) for r in rows] == [("diem", diem), ("none", 0)]
        with pytest.raises(asyncpg.CheckViolationError):
            await insert_usage(connection, cost_diem=Decimal(-1))
    finally:
        await connection.close()


@pytest.mark.parametrize(
    "values",
    [("", 0, 0), ("c", -1, 0), ("c", 0, -0.5)],
)
async def test_impossible_limit_counters_are_rejected(
    db: asyncpg.Connection, values: tuple[str, float, float]
) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute(
            "INSERT INTO limit_counters (counter, used, reserved, keep_until) "
            "VALUES ($1, $2, $3, now())",
            *values,
        )


async def test_a_lease_needs_its_counter_and_goes_with_it(db: asyncpg.Connection) -> None:
    lease = "INSERT INTO limit_leases VALUES ($1, 'c', $2, now())"
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await db.execute(lease, uuid.uuid4(), 1)
    await db.execute("INSERT INTO limit_counters (counter, keep_until) VALUES ('c', now())")
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute(lease, uuid.uuid4(), -1)
    await db.execute(lease, uuid.uuid4(), 1)
    await db.execute("DELETE FROM limit_counters")
    assert await db.fetchval("SELECT count(*) FROM limit_leases") == 0


async def test_the_limits_migration_keeps_this_months_spend(empty_database: str) -> None:
    await asyncio.to_thread(migrations.upgrade, empty_database, "0004")
    connection = await asyncpg.connect(empty_database)
    try:
        subject = uuid.uuid4()
        await connection.execute(
            "INSERT INTO subject_monthly_spend VALUES "
            "($1, date_trunc('month', now() AT TIME ZONE 'UTC')::date, 1.5), "
            "($1, '2020-01-01', 9)",
            subject,
        )
        await asyncio.to_thread(migrations.upgrade, empty_database, "0005")
        rows = await connection.fetch("SELECT counter, used FROM limit_counters")
        month = datetime.now(UTC).strftime("%Y-%m")
        assert [(r["counter"], r["used"]) for r in rows] == [(f"budget:{subject}:{month}", 1.5)]
    finally:
        await connection.close()


async def test_0008_refuses_the_sessions_of_before_and_lets_old_replicas_sign_in(
    empty_database: str,
) -> None:
    await asyncio.to_thread(migrations.upgrade, empty_database, "0005")
    connection = await asyncpg.connect(empty_database)
    # What a replica of the release before 0008 writes when a console signs in.
    old_insert = "INSERT INTO console_sessions (token_hash, expires_at) VALUES ($1, now() + '1h')"
    try:
        await connection.execute(old_insert, hashlib.sha256(b"before").digest())
        await asyncio.to_thread(migrations.upgrade, empty_database, "0008")
        await connection.execute(old_insert, hashlib.sha256(b"during").digest())
        # Today's code runs on today's schema (0020 adds the identity of a single sign-on).
        await asyncio.to_thread(migrations.upgrade, empty_database, "head")
        for token in ("before", "during"):
            assert not await console_sessions.session_is_live(connection, token, bytes(32))
        with pytest.raises(asyncpg.CheckViolationError):
            await console_sessions.create_session(
                connection, "short", datetime.now(UTC) + timedelta(hours=1), b"short"
            )
        await console_sessions.create_session(
            connection, "after", datetime.now(UTC) + timedelta(hours=1), bytes(32)
        )
        assert await console_sessions.session_is_live(connection, "after", bytes(32))
        assert not await console_sessions.session_is_live(connection, "after", b"\1" * 32)
    finally:
        await connection.close()
