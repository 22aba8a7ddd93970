"""The usage ledger's tables: writing batches of usage rows, reporting on them, and retention."""

from __future__ import annotations

import json
import math
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import attrs
import orjson

from llmgw.accounting.usage import UsageRecord, cost_decimal, storable_text
from llmgw.storage.rollup import Exact, add_to_rollup, exact_extras, exact_values, extras_json

__all__ = [
    "GROUPINGS",
    "UsageQuery",
    "dead_letter_json",
    "month_start",
    "prune_usage",
    "read_dead_letters",
    "request_usage",
    "set_aside",
    "summarize_usage",
    "write_batch",
]

_INSERT = """
INSERT INTO usage_events (
    occurred_at, api_key_id, subject_id, request_id, response_id, operation, provider, model,
    stream, status, error_type, input_tokens, output_tokens, cost_usd, duration_ms,
    time_to_first_chunk_ms, usage_source, flags, cost_computed, event_id, cache_read_input_tokens,
    cache_creation_input_tokens, cache_creation_1h_input_tokens, reasoning_output_tokens,
    deployment, attempts, cache_hit, saved_cost_usd, response_model, started_deployment,
    attempt_log, provider_extras
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
          $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31::text::jsonb, $32::text::jsonb)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
"""
# Saturates just below what numeric(30,18) holds, so no amount of spend can make a later row of
# the same subject unstorable (each row's cost is bounded by accounting.usage.MAX_COST).
_ADD_SPEND = """
INSERT INTO subject_monthly_spend AS s (subject_id, month, spend_usd) VALUES ($1, $2, $3)
ON CONFLICT (subject_id, month) DO UPDATE
SET spend_usd = least(s.spend_usd + excluded.spend_usd, 999999999999.999999999999999999)
"""
# A key deleted while its last requests were in flight has no window to charge; its usage rows
# are still written.
_ADD_TOKENS = """
INSERT INTO api_key_token_windows AS w (api_key_id, window_start_at, tokens)
SELECT $1::uuid, $2::timestamptz, $3::bigint WHERE EXISTS (SELECT FROM api_keys WHERE id = $1)
ON CONFLICT (api_key_id, window_start_at) DO UPDATE SET tokens = w.tokens + excluded.tokens
"""
_SET_ASIDE = """
INSERT INTO usage_dead_letters (request_id, record, error_type, error_message)
VALUES ($1, $2, $3, $4)
"""
_ERROR_MESSAGE_CHARS = 2000


def month_start(moment: datetime) -> date:
    return moment.astimezone(UTC).date().replace(day=1)


def minute_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def _decimal(value: float | None) -> Decimal | None:
    return None if value is None else cost_decimal(value)


async def write_batch(conn: asyncpg.Connection, records: Sequence[UsageRecord]) -> None:
    """Insert the rows and add them to the running totals and the hourly rollup, in one transaction;
    rows already stored (by event id) are skipped."""
    async with conn.transaction():
        await _write_new(conn, records)


async def _write_new(conn: asyncpg.Connection, records: Sequence[UsageRecord]) -> None:
    # Each record's exact figures and times, made once for its row, the totals and the rollup.
    # A batch's rows fall in a few minutes: each minute, its hour and its month are made once,
    # not per row (a minute told by the seconds since the epoch: timestamp() is cheaper than
    # replace()).
    times: dict[float, tuple[datetime, datetime, date]] = {}
    exact = []
    for r in records:
        number = r.occurred_at.timestamp() // 60
        when = times.get(number)
        if when is None:
            minute = minute_start(r.occurred_at)
            when = times[number] = (minute, minute.replace(minute=0), month_start(minute))
        exact.append(Exact(*when, _decimal(r.cost_usd), exact_values(r.provider_extras)))
    rows = [
        (
            r.occurred_at, r.api_key_id, r.subject_id, r.request_id, r.response_id,
            r.operation, r.provider, r.model, r.stream, r.status, r.error_type,
            r.input_tokens, r.output_tokens, e.cost_usd, r.duration_ms, r.time_to_first_chunk_ms, r.usage_source, list(r.flags),
            r.cost_computed, r.event_id, r.cache_read_input_tokens,
            r.cache_creation_input_tokens, r.cache_creation_1h_input_tokens,
            r.reasoning_output_tokens, r.deployment, r.attempts, r.cache_hit,
            _decimal(r.saved_cost_usd), r.response_model, r.started_deployment,
            orjson.dumps(r.attempt_log, default=str).decode(),
            extras_json(e.provider_extras),
        )
        for r, e in zip(records, exact, strict=True)
    ]  # fmt: skip
    # Only the rows this insert stored are counted. Those already stored (a replayed spool, a
    # batch retried after its commit was cut off, one still committing when this one began, which
    # the insert waits for) or twice in the batch are not, so no total counts a row twice.
    stored = {row[0] for row in await conn.fetchmany(_INSERT, rows)}
    fresh = list(
        {
            r.event_id: (r, e) for r, e in zip(records, exact, strict=True) if r.event_id in stored
        }.values()
    )
    if not fresh:
        return
    spend: defaultdict[tuple[uuid.UUID, date], Decimal] = defaultdict(Decimal)
    tokens: defaultdict[tuple[uuid.UUID, datetime], int] = defaultdict(int)
    for r, e in fresh:
        if r.subject_id is not None and e.cost_usd:
            spend[(r.subject_id, e.month)] += e.cost_usd
        used = 0 if r.cache_hit else (r.input_tokens or 0) + (r.output_tokens or 0)
        if used:
            tokens[(r.api_key_id, e.minute)] += used
    if spend:
        await conn.executemany(_ADD_SPEND, [(s, m, usd) for (s, m), usd in spend.items()])
    if tokens:
        await conn.executemany(_ADD_TOKENS, [(k, w, n) for (k, w), n in tokens.items()])
    await add_to_rollup(conn, fresh)


async def set_aside(conn: asyncpg.Connection, record: UsageRecord, error: BaseException) -> None:
    """Keep a row the database refused in usage_dead_letters, with why, for an operator to read."""
    await conn.execute(
        _SET_ASIDE,
        storable_text(str(record.request_id)),
        dead_letter_json(record),
        type(error).__name__,
        storable_text(str(error), _ERROR_MESSAGE_CHARS),
    )


def dead_letter_json(record: UsageRecord) -> str:
    """The record as JSON any text column holds and any parser reads, whatever its values are."""
    fields = {name: _json_safe(value) for name, value in record.log_fields().items()}
    # The stdlib encoder, not orjson: it takes integers of any size. ASCII escapes the rest.
    return json.dumps(fields, ensure_ascii=True, default=str)


def _json_safe(value: Any) -> Any:
    if isinstance(value, str):  # a lone surrogate becomes the text "\ud800"
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, tuple | list):
        return [_json_safe(item) for item in value]
    return value


async def read_dead_letters(conn: asyncpg.Connection, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` most recent dead letters, oldest first, each record parsed from its JSON."""
    rows = await conn.fetch(
        """
        SELECT * FROM (
            SELECT id, set_aside_at, request_id, error_type, error_message, record
            FROM usage_dead_letters ORDER BY id DESC LIMIT $1
        ) AS recent ORDER BY id
        """,
        limit,
    )
    return [
        {
            "id": row["id"],
            "set_aside_at": row["set_aside_at"].isoformat(),
            "request_id": row["request_id"],
            "error_type": row["error_type"],
            "error_message": row["error_message"],
            "record": json.loads(row["record"]),
        }
        for row in rows
    ]


GROUPINGS = {
    "model": "model",
    "deployment": "deployment",  # NULL: rows written before the column existed
    "key": "api_key_id::text",
    # The key's team now (a key moved between teams counts for its new one); NULL: no team.
    "team": "(SELECT k.team_id FROM api_keys k WHERE k.id = usage_events.api_key_id)::text",
    "day": "to_char(date_trunc('day', occurred_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD')",
}


@attrs.frozen
class UsageQuery:
    subject_id: uuid.UUID | None = None
    key_id: uuid.UUID | None = None
    team_id: uuid.UUID | None = None
    start: datetime | None = None
    end: datetime | None = None
    group_by: str = "model"


async def summarize_usage(conn: asyncpg.Connection, query: UsageQuery) -> list[dict[str, Any]]:
    """Requests, tokens and cost per group over [start, end)."""
    rows = await conn.fetch(
        f"""
        SELECT {GROUPINGS[query.group_by]} AS grp, count(*) AS requests,
               coalesce(sum(input_tokens), 0) AS input_tokens,
               coalesce(sum(output_tokens), 0) AS output_tokens,
               coalesce(sum(cost_usd), 0) AS cost_usd,
               llmgw_extras_sum(provider_extras)::text AS provider_extras,
               count(*) FILTER (WHERE cache_hit) AS cache_hits,
               coalesce(sum(saved_cost_usd), 0) AS saved_cost_usd
        FROM usage_events
        WHERE ($1::uuid IS NULL OR subject_id = $1) AND ($2::uuid IS NULL OR api_key_id = $2)
          AND ($3::timestamptz IS NULL OR occurred_at >= $3)
          AND ($4::timestamptz IS NULL OR occurred_at < $4)
          AND ($5::uuid IS NULL OR api_key_id IN (SELECT id FROM api_keys WHERE team_id = $5))
        GROUP BY grp ORDER BY grp
        """,
        query.subject_id,
        query.key_id,
        query.start,
        query.end,
        query.team_id,
    )
    return [
        {
            query.group_by: row["grp"],
            "requests": row["requests"],
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "cost_usd": row["cost_usd"],  # Decimal: the exact sum of what providers reported
            # Each figure a provider reported beyond these, by name: the exact sum (Decimal).
            "provider_extras": exact_extras(row["provider_extras"]),
            "cache_hits": row["cache_hits"],  # answered by the response cache, at no cost
            "saved_cost_usd": row["saved_cost_usd"],  # what those answers cost when fetched
        }
        for row in rows
    ]


# A request's ledger row as the admin API shows it: what it was billed and every attempt it made.
_REQUEST_ROWS = """
SELECT request_id, occurred_at, api_key_id, subject_id, operation, provider, model, deployment,
       started_deployment, response_model, response_id, stream, status, error_type,
       input_tokens, output_tokens, cost_usd, usage_source, cost_computed, flags, attempts,
       attempt_log::text AS attempt_log, provider_extras::text AS provider_extras
FROM usage_events WHERE request_id = $1 ORDER BY id
"""


async def request_usage(conn: asyncpg.Connection, request_id: str) -> list[dict[str, Any]]:
    """The ledger rows of one request (one, unless rows were written before event ids), each with
    its attempts: the deployment each was sent to and how it ended."""
    found = []
    for row in await conn.fetch(_REQUEST_ROWS, request_id):
        shown = dict(row)
        shown["occurred_at"] = row["occurred_at"].isoformat()
        for name in ("api_key_id", "subject_id"):
            shown[name] = None if row[name] is None else str(row[name])
        shown["attempt_log"] = orjson.loads(row["attempt_log"])
        shown["provider_extras"] = exact_extras(row["provider_extras"])
        found.append(shown)
    return found


async def prune_usage(conn: asyncpg.Connection, older_than: timedelta) -> int:
    """Delete usage rows (and spent token windows) older than ``older_than``; returns rows deleted."""
    async with conn.transaction():
        status: str = await conn.execute(
            "DELETE FROM usage_events WHERE occurred_at < now() - $1::interval", older_than
        )
        await conn.execute(
            "DELETE FROM api_key_token_windows WHERE window_start_at < now() - interval '1 hour'"
        )
    return int(status.rsplit(" ", 1)[-1])
