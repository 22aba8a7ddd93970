"""Console sign-in sessions: a random token in the browser's cookie, only its SHA-256 here."""

from __future__ import annotations

import hashlib
from datetime import datetime

import asyncpg

__all__ = ["create_session", "delete_session", "session_is_live"]


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def create_session(conn: asyncpg.Connection, token: str, expires_at: datetime) -> None:
    async with conn.transaction():
        # Expired sessions are removed as new ones are made: the table stays as small as its use.
        await conn.execute("DELETE FROM console_sessions WHERE expires_at < now()")
        await conn.execute(
            "INSERT INTO console_sessions (token_hash, expires_at) VALUES ($1, $2)",
            _hash(token),
            expires_at,
        )


async def session_is_live(conn: asyncpg.Connection, token: str) -> bool:
    found = await conn.fetchval(
        "SELECT true FROM console_sessions WHERE token_hash = $1 AND expires_at > now()",
        _hash(token),
    )
    return bool(found)


async def delete_session(conn: asyncpg.Connection, token: str) -> None:
    await conn.execute("DELETE FROM console_sessions WHERE token_hash = $1", _hash(token))
