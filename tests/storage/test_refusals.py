"""Refusal counts: a dict increment per refused request, added per minute to the table in batches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from llmgw.storage.refusals import RefusalCounts, refusals_since
from tests.processes import Clock

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def pool(database_url: str, db: asyncpg.Connection) -> AsyncIterator[asyncpg.Pool]:
    """A one-connection pool on the emptied test database (``db`` empties it)."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, command_timeout=0.5)
    yield pool
    await pool.close()


async def test_counts_are_added_per_minute_and_read_per_status_and_code(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    clock = Clock(NOON.timestamp() + 30)
    counts = RefusalCounts(pool, clock=clock)
    for _ in range(3):
        counts.count("/v1/chat/completions", 429, "rate_limit_exceeded")
    counts.count("/v1/messages", 413, "request_too_large")
    clock.now += 60
    counts.count("/v1/chat/completions", 429, "rate_limit_exceeded")
    assert await counts.flush() is True
    counts.count("/v1/chat/completions", 429, "rate_limit_exceeded")  # added to its minute's row
    assert await counts.flush() is True
    rows = await db.fetch("SELECT minute, requests FROM refusals_by_minute WHERE status = 429")
    assert sorted((row["minute"].minute, row["requests"]) for row in rows) == [(0, 3), (1, 2)]
    assert await refusals_since(db, NOON) == [
        {"status": 429, "code": "rate_limit_exceeded", "requests": 5},
        {"status": 413, "code": "request_too_large", "requests": 1},
    ]
    assert await refusals_since(db, NOON.replace(minute=1)) == [
        {"status": 429, "code": "rate_limit_exceeded", "requests": 2}
    ]


async def test_counts_are_kept_while_the_database_does_not_answer(
    pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    counts = RefusalCounts(pool, clock=Clock(NOON.timestamp() + 30))
    counts.count("/v1/chat/completions", 401, "invalid_api_key")
    # Another session holds the table: the write waits, then times out like a stalled server.
    async with db.transaction():
        await db.execute("LOCK TABLE refusals_by_minute IN ACCESS EXCLUSIVE MODE")
        assert await counts.flush() is False
    counts.count("/v1/chat/completions", 401, "invalid_api_key")
    await counts.close()  # writes what is left
    assert await refusals_since(db, NOON) == [
        {"status": 401, "code": "invalid_api_key", "requests": 2}
    ]
