"""Subjects (teams or users keys belong to): their monthly budget and month-to-date spend."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import asyncpg
import attrs

from llmgw.storage.usage import month_start

__all__ = ["SubjectBudget", "get_subject", "list_subjects", "set_budget"]


@attrs.frozen
class SubjectBudget:
    subject_id: uuid.UUID
    monthly_budget_usd: float | None
    month: date
    month_to_date_spend_usd: float


async def get_subject(conn: asyncpg.Connection, subject_id: uuid.UUID) -> SubjectBudget:
    month = month_start(datetime.now(UTC))
    row = await conn.fetchrow(
        """
        SELECT (SELECT monthly_budget_usd FROM subjects WHERE subject_id = $1) AS cap,
               (SELECT spend_usd FROM subject_monthly_spend WHERE subject_id = $1 AND month = $2)
                   AS spent
        """,
        subject_id,
        month,
    )
    assert row is not None
    cap: Decimal | None = row["cap"]
    return SubjectBudget(
        subject_id=subject_id,
        monthly_budget_usd=None if cap is None else float(cap),
        month=month,
        month_to_date_spend_usd=float(row["spent"] or 0),
    )


async def set_budget(
    conn: asyncpg.Connection, subject_id: uuid.UUID, monthly_budget_usd: float | None
) -> tuple[SubjectBudget, SubjectBudget]:
    """Set or clear (None) the cap; returns the subject before and after."""
    async with conn.transaction():
        before = await get_subject(conn, subject_id)
        await conn.execute(
            """
            INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, $2)
            ON CONFLICT (subject_id)
            DO UPDATE SET monthly_budget_usd = excluded.monthly_budget_usd, updated_at = now()
            """,
            subject_id,
            None if monthly_budget_usd is None else Decimal(str(monthly_budget_usd)),
        )
        after = await get_subject(conn, subject_id)
    return before, after


async def list_subjects(
    conn: asyncpg.Connection, *, limit: int, offset: int
) -> list[SubjectBudget]:
    """Subjects with a budget row or spend this month, by spend (highest first), one page."""
    month = month_start(datetime.now(UTC))
    rows = await conn.fetch(
        """
        SELECT coalesce(s.subject_id, m.subject_id) AS subject_id, s.monthly_budget_usd AS cap,
               coalesce(m.spend_usd, 0) AS spent
        FROM subjects s
        FULL JOIN (SELECT subject_id, spend_usd FROM subject_monthly_spend WHERE month = $1) m
            ON m.subject_id = s.subject_id
        ORDER BY spent DESC, subject_id
        LIMIT $2 OFFSET $3
        """,
        month,
        limit,
        offset,
    )
    return [
        SubjectBudget(
            subject_id=row["subject_id"],
            monthly_budget_usd=None if row["cap"] is None else float(row["cap"]),
            month=month,
            month_to_date_spend_usd=float(row["spent"]),
        )
        for row in rows
    ]
