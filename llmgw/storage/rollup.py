"""Hourly usage rollups: what the console and ``llmgw usage report`` read instead of the raw ledger.

The ledger writer adds each batch to ``usage_hourly`` (one row per hour, key and model) in the same
transaction as the raw rows, so reports over any range read at most hours x keys x models rows, not
one row per request. Latency is kept as counts per fixed bucket, so today's p50/p95 come from the
rollup too (as the upper bound of the bucket the percentile falls in); the last hour's are exact,
from the raw rows.
"""

from __future__ import annotations

import bisect
import functools
import json
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import attrs

from llmgw.accounting.usage import UsageRecord, cost_decimal
from llmgw.storage.refusals import refusals_since

__all__ = [
    "LATENCY_BUCKETS_MS",
    "REPORT_GROUPINGS",
    "Exact",
    "UsageReportQuery",
    "add_to_rollup",
    "exact_extras",
    "exact_values",
    "extras_json",
    "hour_start",
    "overview",
    "percentile_from_buckets",
    "usage_report",
]

# Upper bounds (ms) of the latency buckets; a last, open bucket holds everything slower.
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 600_000,
)  # fmt: skip
_BUCKET_COUNT = len(LATENCY_BUCKETS_MS) + 1

_UPSERT = """
INSERT INTO usage_hourly AS h (
    hour, api_key_id, model, subject_id, requests, errors, input_tokens, output_tokens,
    cost_usd, duration_ms_sum, latency_buckets, cache_hits, saved_cost_usd, provider_extras
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14::text::jsonb)
ON CONFLICT (hour, api_key_id, model) DO UPDATE SET
    requests = h.requests + excluded.requests,
    errors = h.errors + excluded.errors,
    input_tokens = h.input_tokens + excluded.input_tokens,
    output_tokens = h.output_tokens + excluded.output_tokens,
    cost_usd = h.cost_usd + excluded.cost_usd,
    provider_extras = llmgw_extras_add(h.provider_extras, excluded.provider_extras),
    duration_ms_sum = h.duration_ms_sum + excluded.duration_ms_sum,
    cache_hits = h.cache_hits + excluded.cache_hits,
    saved_cost_usd = h.saved_cost_usd + excluded.saved_cost_usd,
    latency_buckets = (
        SELECT array_agg(a + b ORDER BY i)
        FROM unnest(h.latency_buckets, excluded.latency_buckets) WITH ORDINALITY AS t(a, b, i)
    )
"""


def hour_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _bucket(duration_ms: float) -> int:
    """The first bucket whose bound is at least ``duration_ms`` (the open last one past them all),
    found by bisection: a record's duration is finite (UsageRecord bounds it)."""
    return bisect.bisect_left(LATENCY_BUCKETS_MS, duration_ms)


@attrs.define
class _Cell:
    subject_id: uuid.UUID | None
    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    duration_ms_sum: float = 0.0
    latency: list[int] = attrs.field(factory=lambda: [0] * _BUCKET_COUNT)
    cache_hits: int = 0
    saved_cost_usd: Decimal = Decimal(0)
    provider_extras: defaultdict[str, Decimal] = attrs.field(factory=lambda: defaultdict(Decimal))


def _decimal(value: float | None) -> Decimal:
    return Decimal(0) if value is None else cost_decimal(value)


def exact_values(extras: Mapping[str, float]) -> dict[str, Decimal]:
    """A record's provider extras as the exact decimals the provider wrote (see cost_decimal)."""
    return {name: cost_decimal(value) for name, value in extras.items()}


def extras_json(extras: Mapping[str, Decimal]) -> str:
    """Provider extras as the JSON object their columns hold, each number exactly as written."""
    members = (f"{_json_name(name)}:{format(value, 'f')}" for name, value in extras.items())
    return "{" + ",".join(members) + "}"


@functools.lru_cache(maxsize=1024)
def _json_name(name: str) -> str:
    # Every row names the same few extras (a provider's CostReport's): encoded once each, not per
    # row; the cache bounds what names no provider repeats can hold.
    return json.dumps(name, ensure_ascii=True)


def exact_extras(text: str) -> dict[str, Decimal]:
    """Provider extras read back from the database (a JSON object), each an exact decimal."""
    extras: dict[str, Decimal] = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    return extras


@attrs.frozen(slots=True)
class Exact:
    """What the ledger writer made of a record for its row, and the rollup adds up as it is."""

    minute: datetime  # its occurred_at's minute, in UTC
    hour: datetime  # that minute's hour (hour_start)
    month: date  # that minute's month (its first day)
    cost_usd: Decimal | None  # cost_decimal of its cost_usd
    provider_extras: dict[str, Decimal]  # exact_values of its provider_extras


async def add_to_rollup(
    conn: asyncpg.Connection, records: Sequence[tuple[UsageRecord, Exact]]
) -> None:
    """Add a batch to the hourly rollup; call inside the transaction that writes the raw rows."""
    cells: dict[tuple[datetime, uuid.UUID, str], _Cell] = {}
    for r, exact in records:
        key = (exact.hour, r.api_key_id, r.model)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = _Cell(r.subject_id)
        cell.requests += 1
        cell.errors += r.status is None or r.status >= 400  # None: a status no HTTP has
        cell.input_tokens += r.input_tokens or 0
        cell.output_tokens += r.output_tokens or 0
        if exact.cost_usd is not None:
            cell.cost_usd += exact.cost_usd
        for name, value in exact.provider_extras.items():
            cell.provider_extras[name] += value
        cell.duration_ms_sum += r.duration_ms
        cell.latency[_bucket(r.duration_ms)] += 1
        if r.cache_hit:
            cell.cache_hits += 1
            cell.saved_cost_usd += _decimal(r.saved_cost_usd)
    # Sorted, so concurrent replicas lock rows in the same order and cannot deadlock.
    await conn.executemany(
        _UPSERT,
        [
            (
                hour, key_id, model, c.subject_id, c.requests, c.errors, c.input_tokens,
                c.output_tokens, c.cost_usd, c.duration_ms_sum, c.latency, c.cache_hits,
                c.saved_cost_usd, extras_json(c.provider_extras),
            )
            for (hour, key_id, model), c in sorted(cells.items(), key=lambda item: item[0])
        ],
    )  # fmt: skip


def percentile_from_buckets(counts: Sequence[int], fraction: float) -> float | None:
    """The upper bound (ms) of the bucket holding the ``fraction`` percentile; None if empty.

    The open last bucket reports the largest finite bound: "at least" that slow.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = fraction * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            return LATENCY_BUCKETS_MS[min(index, len(LATENCY_BUCKETS_MS) - 1)]
    return LATENCY_BUCKETS_MS[-1]


def _add_buckets(into: list[int], more: Sequence[int]) -> None:
    for index, count in enumerate(more):
        into[index] += count


REPORT_GROUPINGS = {
    "day": "to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "hour": "to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')",
    "model": "model",
    "key": "api_key_id::text",
    "subject": "coalesce(subject_id::text, '')",
    # The key's team now (a key moved between teams counts for its new one); '': no team.
    "team": "coalesce((SELECT k.team_id FROM api_keys k WHERE k.id = usage_hourly.api_key_id)::text, '')",
}
# Longest range a report may cover: a bound on the rows one query reads.
MAX_REPORT_DAYS = 400


@attrs.frozen
class UsageReportQuery:
    by: str  # one of REPORT_GROUPINGS
    start: date  # first day, inclusive (UTC)
    end: date  # last day, exclusive (UTC)
    key_id: uuid.UUID | None = None
    subject_id: uuid.UUID | None = None
    team_id: uuid.UUID | None = None


async def usage_report(conn: asyncpg.Connection, query: UsageReportQuery) -> list[dict[str, Any]]:
    """Requests, errors, tokens and spend per group over whole UTC days."""
    rows = await conn.fetch(
        f"""
        SELECT {REPORT_GROUPINGS[query.by]} AS grp,
               sum(requests)::bigint AS requests, sum(errors)::bigint AS errors,
               sum(input_tokens)::bigint AS input_tokens,
               sum(output_tokens)::bigint AS output_tokens,
               sum(cost_usd) AS cost_usd,
               llmgw_extras_sum(provider_extras)::text AS provider_extras,
               sum(cache_hits)::bigint AS cache_hits, sum(saved_cost_usd) AS saved_cost_usd
        FROM usage_hourly
        WHERE hour >= $1 AND hour < $2
          AND ($3::uuid IS NULL OR api_key_id = $3) AND ($4::uuid IS NULL OR subject_id = $4)
          AND ($5::uuid IS NULL OR api_key_id IN (SELECT id FROM api_keys WHERE team_id = $5))
        GROUP BY grp ORDER BY grp
        """,
        _midnight(query.start),
        _midnight(query.end),
        query.key_id,
        query.subject_id,
        query.team_id,
    )
    report = [
        {
            query.by: row["grp"] or None,
            "requests": row["requests"],
            "errors": row["errors"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "cost_usd": _usd(row["cost_usd"]),
            "provider_extras": {
                name: _usd(value) for name, value in exact_extras(row["provider_extras"]).items()
            },
            "cache_hits": row["cache_hits"],
            "saved_cost_usd": _usd(row["saved_cost_usd"]),
        }
        for row in rows
    ]
    if query.by == "key":
        await _name_keys(conn, report)
    if query.by == "team":
        await _name_teams(conn, report)
    return report


async def _name_teams(conn: asyncpg.Connection, report: list[dict[str, Any]]) -> None:
    """Add each team's name (None for no team, or a team since deleted)."""
    found = {
        str(row["id"]): row["name"]
        for row in await conn.fetch(
            "SELECT id, name FROM teams WHERE id = ANY($1::uuid[])",
            [row["team"] for row in report if row["team"]],
        )
    }
    for row in report:
        row["name"] = found.get(row["team"] or "")


async def _name_keys(conn: asyncpg.Connection, report: list[dict[str, Any]]) -> None:
    """Add each key's name and prefix (None for a key since deleted): ids alone mean nothing to a reader."""
    found = {
        str(row["id"]): row
        for row in await conn.fetch(
            "SELECT id, name, prefix FROM api_keys WHERE id = ANY($1::uuid[])",
            [row["key"] for row in report],
        )
    }
    for row in report:
        key = found.get(row["key"])
        row["name"] = None if key is None else key["name"]
        row["prefix"] = None if key is None else key["prefix"]


# Today's figures per model, with latency percentiles from the summed bucket counts.
_TODAY = """
SELECT model, sum(requests)::bigint AS requests, sum(errors)::bigint AS errors,
       sum(cost_usd) AS cost_usd, array_agg(latency_buckets) AS latency,
       sum(cache_hits)::bigint AS cache_hits, sum(saved_cost_usd) AS saved_cost_usd
FROM usage_hourly WHERE hour >= $1 GROUP BY model ORDER BY model
"""


def _today_row(row: asyncpg.Record) -> dict[str, Any]:
    latency = [0] * _BUCKET_COUNT
    for counts in row["latency"]:
        _add_buckets(latency, counts)
    return {
        "model": row["model"],
        "requests": row["requests"],
        "errors": row["errors"],
        "cost_usd": _usd(row["cost_usd"]),
        "cache_hits": row["cache_hits"],
        "saved_cost_usd": _usd(row["saved_cost_usd"]),
        "p50_ms": percentile_from_buckets(latency, 0.50),
        "p95_ms": percentile_from_buckets(latency, 0.95),
    }


def _usd(amount: Decimal | None) -> str:
    """An exact decimal amount as plain text without trailing zeros ("0.000104", never "1E-4")."""
    if amount is None:
        return "0"
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# The last hour is read from the raw ledger (minute-exact), newest rows first, at most this many.
LAST_HOUR_ROW_CAP = 200_000

_LAST_HOUR = """
SELECT model, count(*) AS requests, count(*) FILTER (WHERE status IS NULL OR status >= 400) AS errors,
       coalesce(sum(cost_usd), 0) AS cost_usd,
       count(*) FILTER (WHERE cache_hit) AS cache_hits,
       coalesce(sum(saved_cost_usd), 0) AS saved_cost_usd,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_ms) AS p95_ms
FROM (
    SELECT model, status, cost_usd, duration_ms, cache_hit, saved_cost_usd FROM usage_events
    WHERE occurred_at >= $1 ORDER BY occurred_at DESC LIMIT $2
) recent
GROUP BY model ORDER BY model
"""


async def overview(conn: asyncpg.Connection, now: datetime) -> dict[str, Any]:
    """The console's first page: the last hour (raw ledger), today and the last 24 hours (rollup);
    with each period, the requests the gateway refused itself (never in the ledger)."""
    last_hour = [
        {
            "model": row["model"],
            "requests": row["requests"],
            "errors": row["errors"],
            "cost_usd": _usd(row["cost_usd"]),
            "cache_hits": row["cache_hits"],
            "saved_cost_usd": _usd(row["saved_cost_usd"]),
            "p50_ms": None if row["p50_ms"] is None else round(row["p50_ms"], 3),
            "p95_ms": None if row["p95_ms"] is None else round(row["p95_ms"], 3),
        }
        for row in await conn.fetch(_LAST_HOUR, now - timedelta(hours=1), LAST_HOUR_ROW_CAP)
    ]
    today = now.astimezone(UTC).date()
    by_model = [_today_row(row) for row in await conn.fetch(_TODAY, _midnight(today))]
    series_rows = await conn.fetch(
        """
        SELECT hour, sum(requests)::bigint AS requests, sum(errors)::bigint AS errors,
               sum(cost_usd) AS cost_usd
        FROM usage_hourly WHERE hour > $1 AND hour <= $2
        GROUP BY hour ORDER BY hour
        """,
        hour_start(now) - timedelta(hours=24),
        hour_start(now),
    )
    # Refusals are counted per minute: "the last hour" starts at the minute an hour ago.
    hour_ago = (now - timedelta(hours=1)).replace(second=0, microsecond=0)
    return {
        "generated_at": now.isoformat(),
        "last_hour": {
            "by_model": last_hour,
            **_totals(last_hour),
            "refused": await refusals_since(conn, hour_ago),
        },
        "today": {
            "by_model": by_model,
            **_totals(by_model),
            "refused": await refusals_since(conn, _midnight(today)),
        },
        "series": _hourly_series(series_rows, hour_start(now)),
    }


def _hourly_series(rows: list[asyncpg.Record], last_hour: datetime) -> list[dict[str, Any]]:
    """The 24 hours ending with ``last_hour``, oldest first; hours without requests as zeros."""
    found = {row["hour"]: row for row in rows}
    series = []
    for back in range(23, -1, -1):
        hour = last_hour - timedelta(hours=back)
        row = found.get(hour)
        series.append(
            {
                "hour": hour.isoformat(),
                "requests": 0 if row is None else row["requests"],
                "errors": 0 if row is None else row["errors"],
                "cost_usd": "0" if row is None else _usd(row["cost_usd"]),
            }
        )
    return series


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    requests = sum(row["requests"] for row in rows)
    hits = sum(row["cache_hits"] for row in rows)
    return {
        "requests": requests,
        "errors": sum(row["errors"] for row in rows),
        "cost_usd": _usd(sum((Decimal(row["cost_usd"]) for row in rows), Decimal(0))),
        "cache_hits": hits,
        "cache_hit_rate": hits / requests if requests else 0.0,
        "saved_cost_usd": _usd(sum((Decimal(row["saved_cost_usd"]) for row in rows), Decimal(0))),
    }
