"""Subjects' budgets: set and cleared with the state before and after, and listed with this
month's spend, highest first, including subjects that spend without a budget."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg

from llmgw.storage.subjects import get_subject, list_subjects, set_budget
from llmgw.storage.usage import month_start


async def spend(db: asyncpg.Connection, subject_id: uuid.UUID, usd: float) -> None:
    await db.execute(
        "INSERT INTO subject_monthly_spend (subject_id, month, spend_usd) VALUES ($1, $2, $3)",
        subject_id,
        month_start(datetime.now(UTC)),
        usd,
    )


async def test_a_budget_is_set_then_cleared_with_before_and_after(db: asyncpg.Connection) -> None:
    subject = uuid.uuid4()
    unknown = await get_subject(db, subject)
    assert (unknown.monthly_budget_usd, unknown.month_to_date_spend_usd) == (None, 0.0)
    before, after = await set_budget(db, subject, 12.5)
    assert (before.monthly_budget_usd, after.monthly_budget_usd) == (None, 12.5)
    before, after = await set_budget(db, subject, None)
    assert (before.monthly_budget_usd, after.monthly_budget_usd) == (12.5, None)


async def test_subjects_are_listed_by_this_months_spend(db: asyncpg.Connection) -> None:
    budget_only, big, small = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await set_budget(db, budget_only, 5.0)
    await set_budget(db, small, 1.0)
    await spend(db, small, 0.25)
    await spend(db, big, 3.0)  # spends without a budget of its own
    listed = await list_subjects(db, limit=10, offset=0)
    assert [(s.subject_id, s.monthly_budget_usd, s.month_to_date_spend_usd) for s in listed] == [
        (big, None, 3.0),
        (small, 1.0, 0.25),
        (budget_only, 5.0, 0.0),
    ]
    assert [s.subject_id for s in await list_subjects(db, limit=1, offset=1)] == [small]
    assert (await get_subject(db, small)).month_to_date_spend_usd == 0.25
