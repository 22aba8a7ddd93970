"""The hourly rollup: written with every ledger batch, backfilled by its migration, read by reports."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from llmgw.admin.api import report_csv
from llmgw.storage import api_keys, migrations
from llmgw.storage.rollup import (
    LATENCY_BUCKETS_MS,
    UsageReportQuery,
    overview,
    percentile_from_buckets,
    usage_report,
)
from llmgw.storage.usage import UsageQuery, summarize_usage, write_batch
from tests.usage_records import usage_record

NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_percentiles_name_the_bucket_they_fall_in() -> None:
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    assert percentile_from_buckets(counts, 0.5) is None
    counts[0] = 50  # <= 5 ms
    counts[4] = 45  # <= 100 ms
    counts[-1] = 5  # slower than the last bound
    assert percentile_from_buckets(counts, 0.5) == 5
    assert percentile_from_buckets(counts, 0.51) == 100
    assert percentile_from_buckets(counts, 0.95) == 100
    assert percentile_from_buckets(counts, 0.96) == LATENCY_BUCKETS_MS[-1]


async def _records(db: asyncpg.Connection) -> list[Any]:
    subject = uuid.uuid4()
    key_a, key_b = [
        (await api_keys.create_key(db, api_keys.KeySettings(name=name))).record.id
        for name in ("a", "b")
    ]
    records = []
    # Durations on, just under and just over bucket bounds, two hours, two keys, two models.
    for index, duration in enumerate((5.0, 5.001, 4.999, 100.0, 250.0, 999.9, 700_000.0, 0.0)):
        records.append(
            usage_record(
                occurred_at=NOON + timedelta(minutes=25 * index),
                api_key_id=key_a if index % 2 else key_b,
                subject_id=subject if index % 2 else None,
                model="m-one" if index < 5 else "m-two",
                status=200 if index != 3 else 502,
                input_tokens=10 + index,
                output_tokens=None if index == 2 else 2 * index,
                cost_usd=round(0.00010471 * (index + 1), 8),
                duration_ms=duration,
            )
        )
    return records


_ROLLUP = "SELECT * FROM usage_hourly ORDER BY hour, api_key_id, model"


async def test_every_batch_is_added_to_the_rollup_exactly(db: asyncpg.Connection) -> None:
    records = await _records(db)
    await write_batch(db, records[:3])
    await write_batch(db, records[3:])  # upserts into rows the first batch made
    rows = await db.fetch(_ROLLUP)
    assert sum(row["requests"] for row in rows) == len(records)
    assert sum(row["errors"] for row in rows) == 1
    assert sum(row["input_tokens"] for row in rows) == sum(r.input_tokens for r in records)
    assert sum(row["output_tokens"] for row in rows) == sum(r.output_tokens or 0 for r in records)
    raw_cost = await db.fetchval("SELECT sum(cost_usd) FROM usage_events")
    assert sum((row["cost_usd"] for row in rows), Decimal(0)) == raw_cost
    assert all(sum(row["latency_buckets"]) == row["requests"] for row in rows)
    assert all(row["hour"].minute == 0 for row in rows)


async def test_the_migration_backfills_what_the_ledger_would_have_written(
    db: asyncpg.Connection, empty_database: str
) -> None:
    records = await _records(db)
    await write_batch(db, records)
    expected = [dict(row) for row in await db.fetch(_ROLLUP)]
    # The same raw rows in a database at the revision before the rollup existed...
    await asyncio.to_thread(migrations.upgrade, empty_database, "0003")
    older = await asyncpg.connect(empty_database)
    try:
        raw = await db.fetch("SELECT * FROM usage_events ORDER BY id")
        # The columns the older revision has (later ones, e.g. usage_source, have defaults).
        older_columns = {
            row["column_name"]
            for row in await older.fetch(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'usage_events' AND column_name <> 'id'"
            )
        }
        columns = [name for name in raw[0].keys() if name in older_columns]  # noqa: SIM118
        await older.executemany(
            f"INSERT INTO usage_events ({', '.join(columns)}) "
            f"VALUES ({', '.join(f'${i + 1}' for i in range(len(columns)))})",
            [tuple(row[name] for name in columns) for row in raw],
        )
        # ...then migrated: the backfill gives the very same rollup.
        await asyncio.to_thread(migrations.upgrade, empty_database)
        assert [dict(row) for row in await older.fetch(_ROLLUP)] == expected
    finally:
        await older.close()


async def test_reports_group_by_day_model_key_and_subject(db: asyncpg.Connection) -> None:
    records = await _records(db)
    await write_batch(db, records)
    day = NOON.date()
    query = UsageReportQuery(by="day", start=day, end=day + timedelta(days=1))
    (only_day,) = await usage_report(db, query)
    assert only_day["day"] == day.isoformat()
    assert only_day["requests"] == len(records)
    assert Decimal(only_day["cost_usd"]) == sum(
        (Decimal(str(r.cost_usd)) for r in records), Decimal(0)
    )
    by_model = await usage_report(
        db, UsageReportQuery(by="model", start=day, end=day + timedelta(1))
    )
    assert [(row["model"], row["requests"]) for row in by_model] == [("m-one", 5), ("m-two", 3)]
    by_subject = await usage_report(
        db, UsageReportQuery(by="subject", start=day, end=day + timedelta(1))
    )
    assert sorted(row["requests"] for row in by_subject) == [4, 4]
    assert {row["subject"] for row in by_subject} == {None, str(records[1].subject_id)}
    by_key = await usage_report(
        db,
        UsageReportQuery(by="key", start=day, end=day + timedelta(1), key_id=records[1].api_key_id),
    )
    assert [row["key"] for row in by_key] == [str(records[1].api_key_id)]
    # Named, so a reader need not look ids up: records[1] is key "a".
    key_a = await api_keys.find_key(db, str(records[1].api_key_id))
    assert [(row["name"], row["prefix"]) for row in by_key] == [("a", key_a.prefix)]
    assert await usage_report(db, UsageReportQuery(by="day", start=date(2026, 1, 1), end=day)) == []


async def test_provider_extras_are_summed_by_name_in_the_rollup_and_the_reports(
    db: asyncpg.Connection,
) -> None:
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="x"))).record.id
    extras = [
        {"venice.cost.diem": 0.00010471875, "venice.cost.usd": 0.1},
        {"venice.cost.diem": 0.2},
        {},
        {"other.cost.credits": 3},
    ]
    records = [
        usage_record(occurred_at=NOON, api_key_id=key, model="m", provider_extras=each)
        for each in extras
    ]
    await write_batch(db, records[:2])
    await write_batch(db, records[2:])  # upserted into the row the first batch made
    rollup = await db.fetchval("SELECT provider_extras::text FROM usage_hourly")
    assert json.loads(rollup, parse_float=Decimal) == {
        "other.cost.credits": 3,
        "venice.cost.usd": Decimal("0.1"),
        "venice.cost.diem": Decimal("0.20010471875"),
    }
    day = NOON.date()
    (row,) = await usage_report(db, UsageReportQuery(by="model", start=day, end=day + timedelta(1)))
    assert row["provider_extras"] == {
        "other.cost.credits": "3",
        "venice.cost.usd": "0.1",
        "venice.cost.diem": "0.20010471875",
    }
    assert "provider_extras" in report_csv("model", [row]).splitlines()[0]
    (summed,) = await summarize_usage(db, UsageQuery(key_id=key))
    assert summed["provider_extras"] == {
        "other.cost.credits": 3,
        "venice.cost.usd": Decimal("0.1"),
        "venice.cost.diem": Decimal("0.20010471875"),
    }
    raw = await db.fetch("SELECT provider_extras::text AS extras FROM usage_events ORDER BY id")
    assert [r["extras"] for r in raw][1:3] == ['{"venice.cost.diem": 0.2}', "{}"]


@pytest.mark.parametrize("minutes_ago", [5, 59])
async def test_overview_counts_the_last_hour_exactly_and_fills_the_day(
    db: asyncpg.Connection, minutes_ago: int
) -> None:
    now = NOON + timedelta(minutes=30)  # the last hour and the 24 before it are all "today"
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="k"))).record.id
    recent = usage_record(
        api_key_id=key, occurred_at=now - timedelta(minutes=minutes_ago), duration_ms=42.0
    )
    old = usage_record(
        api_key_id=key, occurred_at=now - timedelta(minutes=61), cost_usd=0.5, duration_ms=45.0
    )
    await write_batch(db, [recent, old])
    page = await overview(db, now)
    assert page["last_hour"]["requests"] == 1
    assert page["last_hour"]["by_model"][0]["p50_ms"] == 42.0
    assert len(page["series"]) == 24
    assert sum(point["requests"] for point in page["series"]) == 2
    (today,) = page["today"]["by_model"]
    assert today["p50_ms"] == 50  # 42 ms falls in the bucket up to 50 ms
    assert page["series"][-1]["hour"].startswith(now.strftime("%Y-%m-%dT%H:00"))
