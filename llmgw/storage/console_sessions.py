"""Console sign-in sessions: a random token in the browser's cookie, only its SHA-256 here.

Each row also keeps the fingerprint of the admin token the session was signed in with (computed
by the console); a session is live only while that fingerprint is the current token's.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import asyncpg
import attrs
import orjson

__all__ = [
    "consume_sign_in",
    "create_session",
    "delete_all_sessions",
    "delete_session",
    "live_session",
    "save_sign_in",
    "session_is_live",
]


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def create_session(
    conn: asyncpg.Connection,
    token: str,
    expires_at: datetime,
    admin_fingerprint: bytes,
    identity: dict[str, Any] | None = None,
) -> None:
    """``identity``: a single sign-on's person and role (None: signed in with the admin token)."""
    async with conn.transaction():
        # Expired sessions are removed as new ones are made: the table stays as small as its use.
        await conn.execute("DELETE FROM console_sessions WHERE expires_at < now()")
        await conn.execute(
            "INSERT INTO console_sessions (token_hash, expires_at, admin_token_fingerprint, "
            "identity) VALUES ($1, $2, $3, $4::jsonb)",
            _hash(token),
            expires_at,
            admin_fingerprint,
            None if identity is None else orjson.dumps(identity).decode(),
        )


@attrs.frozen
class LiveSession:
    identity: dict[str, Any] | None  # None: the admin token's


async def live_session(
    conn: asyncpg.Connection, token: str, admin_fingerprint: bytes
) -> LiveSession | None:
    row = await conn.fetchrow(
        "SELECT identity::text FROM console_sessions "
        "WHERE token_hash = $1 AND admin_token_fingerprint = $2 AND expires_at > now()",
        _hash(token),
        admin_fingerprint,
    )
    if row is None:
        return None
    return LiveSession(None if row["identity"] is None else orjson.loads(row["identity"]))


async def session_is_live(conn: asyncpg.Connection, token: str, admin_fingerprint: bytes) -> bool:
    return await live_session(conn, token, admin_fingerprint) is not None


@attrs.frozen
class PendingSignIn:
    nonce: str = attrs.field(repr=False)
    code_verifier: str = attrs.field(repr=False)
    redirect_uri: str


async def save_sign_in(
    conn: asyncpg.Connection, state: str, pending: PendingSignIn, expires_at: datetime
) -> None:
    """A single sign-on under way, found again (once) by its ``state``."""
    async with conn.transaction():
        await conn.execute("DELETE FROM console_oidc_logins WHERE expires_at < now()")
        await conn.execute(
            "INSERT INTO console_oidc_logins (state_hash, nonce, code_verifier, redirect_uri, "
            "expires_at) VALUES ($1, $2, $3, $4, $5)",
            _hash(state),
            pending.nonce,
            pending.code_verifier,
            pending.redirect_uri,
            expires_at,
        )


async def consume_sign_in(conn: asyncpg.Connection, state: str) -> PendingSignIn | None:
    """The sign-in of ``state``, removed as it is read: a replayed state finds nothing."""
    row = await conn.fetchrow(
        "DELETE FROM console_oidc_logins WHERE state_hash = $1 "
        "RETURNING nonce, code_verifier, redirect_uri, expires_at > now() AS live",
        _hash(state),
    )
    if row is None or not row["live"]:
        return None
    return PendingSignIn(row["nonce"], row["code_verifier"], row["redirect_uri"])


async def delete_session(conn: asyncpg.Connection, token: str) -> None:
    await conn.execute("DELETE FROM console_sessions WHERE token_hash = $1", _hash(token))


async def delete_all_sessions(conn: asyncpg.Connection) -> int:
    """Sign out everywhere: every console session ends; returns how many were live."""
    revoked = await conn.fetchval(
        "WITH gone AS (DELETE FROM console_sessions RETURNING expires_at) "
        "SELECT count(*) FILTER (WHERE expires_at > now()) FROM gone"
    )
    return int(revoked)
