"""The admin audit trail: who did what to which key or subject, with settings before and after."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

__all__ = ["write_audit"]


async def write_audit(
    conn: asyncpg.Connection,
    *,
    actor: str,
    action: str,
    target: str | None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """Callers pass records without secrets (key records never hold the plaintext or hash)."""
    await conn.execute(
        "INSERT INTO admin_audit (actor, action, target, before, after) "
        "VALUES ($1, $2, $3, $4::jsonb, $5::jsonb)",
        actor,
        action,
        target,
        None if before is None else orjson.dumps(before).decode(),
        None if after is None else orjson.dumps(after).decode(),
    )
