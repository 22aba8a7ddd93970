"""The admin audit trail: who did what to which key or subject, with settings before and after."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg
import attrs
import orjson

__all__ = ["AuditEntry", "list_audit", "write_audit"]


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


@attrs.frozen
class AuditEntry:
    id: int
    occurred_at: datetime
    actor: str
    action: str
    target: str | None
    before: Any
    after: Any


async def list_audit(
    conn: asyncpg.Connection,
    *,
    limit: int,
    before_id: int | None = None,
    teams: list[uuid.UUID] | None = None,
) -> list[AuditEntry]:
    """Newest first; ``before_id`` continues from the last entry of the previous page; ``teams``:
    only the entries about those teams and their keys."""
    rows = await conn.fetch(
        "SELECT id, occurred_at, actor, action, target, before::text, after::text FROM admin_audit "
        "WHERE ($1::bigint IS NULL OR id < $1) AND ($3::uuid[] IS NULL "
        "  OR target IN (SELECT id::text FROM api_keys WHERE team_id = ANY($3)) "
        "  OR target = ANY($3::text[])) "
        "ORDER BY id DESC LIMIT $2",
        before_id,
        limit,
        teams,
    )
    return [
        AuditEntry(
            id=row["id"],
            occurred_at=row["occurred_at"],
            actor=row["actor"],
            action=row["action"],
            target=row["target"],
            before=None if row["before"] is None else orjson.loads(row["before"]),
            after=None if row["after"] is None else orjson.loads(row["after"]),
        )
        for row in rows
    ]
