"""Console sessions: live until they expire, are signed out, or the admin token changes; only the
token's SHA-256 is stored."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import asyncpg

from llmgw.storage.console_sessions import (
    create_session,
    delete_all_sessions,
    delete_session,
    session_is_live,
)

ADMIN = hashlib.sha256(b"the admin token").digest()  # 32 bytes, as the console computes


def hours(count: float) -> datetime:
    return datetime.now(UTC) + timedelta(hours=count)


async def create_expired(db: asyncpg.Connection, token: str) -> None:
    """A session made two hours ago for one hour (a session cannot be made expired)."""
    await create_session(db, token, hours(1), ADMIN)
    await db.execute(
        "UPDATE console_sessions SET created_at = created_at - interval '2 hours', "
        "expires_at = expires_at - interval '2 hours' WHERE token_hash = $1",
        hashlib.sha256(token.encode()).digest(),
    )


async def test_a_session_is_live_until_it_is_signed_out(db: asyncpg.Connection) -> None:
    await create_session(db, "token-1", hours(1), ADMIN)
    assert await session_is_live(db, "token-1", ADMIN)
    assert not await session_is_live(db, "token-2", ADMIN)
    assert not await session_is_live(db, "token-1", hashlib.sha256(b"another admin token").digest())
    stored = await db.fetchval("SELECT token_hash FROM console_sessions")
    assert bytes(stored) == hashlib.sha256(b"token-1").digest()  # never the token itself
    await delete_session(db, "token-1")
    assert not await session_is_live(db, "token-1", ADMIN)


async def test_expired_sessions_are_dead_and_removed_as_new_ones_come(
    db: asyncpg.Connection,
) -> None:
    await create_expired(db, "old")
    assert not await session_is_live(db, "old", ADMIN)
    await create_session(db, "new", hours(1), ADMIN)
    assert await db.fetchval("SELECT count(*) FROM console_sessions") == 1


async def test_signing_out_everywhere_counts_the_live_sessions_it_ended(
    db: asyncpg.Connection,
) -> None:
    await create_session(db, "a", hours(1), ADMIN)
    await create_session(db, "b", hours(1), ADMIN)
    await create_expired(db, "expired")  # last: no creation removed it yet
    assert await delete_all_sessions(db) == 2
    assert not await session_is_live(db, "a", ADMIN)
    assert await db.fetchval("SELECT count(*) FROM console_sessions") == 0
