"""Console sign-in sessions: a random token in the browser's cookie, only its SHA-256 here.

Each row also keeps the fingerprint of the admin token the session was signed in with (computed
by the console); a session is live only while that fingerprint is the current token's.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import asyncpg

__all__ = ["create_session", "delete_all_sessions", "delete_session", "session_is_live"]


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def create_session(
    conn: asyncpg.Connection, token: str, expires_at: datetime, admin_fingerprint: bytes
) -> None:
    async with conn.transaction():
        # Expired sessions are removed as new ones are made: the table stays as small as its use.
        await conn.execute("DELETE FROM console_sessions WHERE expires_at < now()")
        await conn.execute(
            "INSERT INTO console_sessions (token_hash, expires_at, admin_token_fingerprint) "
            "VALUES ($1, $2, $3)",
            _hash(token),
            expires_at,
            admin_fingerprint,
        )


async def session_is_live(conn: asyncpg.Connection, token: str, admin_fingerprint: bytes) -> bool:
    found = await conn.fetchval(
        "SELECT true FROM console_sessions "
        "WHERE token_hash = $1 AND admin_token_fingerprint = $2 AND expires_at > now()",
        _hash(token),
        admin_fingerprint,
    )
    return bool(found)


async def delete_session(conn: asyncpg.Connection, token: str) -> None:
    await conn.execute("DELETE FROM console_sessions WHERE token_hash = $1", _hash(token))


async def delete_all_sessions(conn: asyncpg.Connection) -> int:
    """Sign out everywhere: every console session ends; returns how many were live."""
    revoked = await conn.fetchval(
        "WITH gone AS (DELETE FROM console_sessions RETURNING expires_at) "
        "SELECT count(*) FILTER (WHERE expires_at > now()) FROM gone"
    )
    return int(revoked)
