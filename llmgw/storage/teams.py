"""Teams: create, list, find, change and delete them, with their month-to-date spend.

A team's spend is the sum over the keys it has now of their usage this month (UTC), wherever it
was made; its limits are enforced by llmgw.limits with the key's own, read with the key
(llmgw.auth.authenticator). The budget counter there holds what keys spent while in the team; a
key that moves carries the rest (:func:`carry_key_spend`), so the two agree.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import attrs

from llmgw.storage.updates import set_clause
from llmgw.storage.usage import month_start

__all__ = [
    "TEAM_FIELDS",
    "TeamHasKeys",
    "TeamNameTaken",
    "TeamNotFound",
    "TeamRecord",
    "TeamSettings",
    "carry_key_spend",
    "create_team",
    "delete_team",
    "find_team",
    "list_teams",
    "update_team",
]


class TeamNotFound(Exception):
    """No team has that id."""


class TeamNameTaken(Exception):
    """Another team already has that name."""


class TeamHasKeys(Exception):
    """The team still has active keys: revoke them (or move them) first."""


@attrs.frozen
class TeamSettings:
    name: str
    monthly_budget_usd: float | None = None
    rate_limit_requests: int | None = None
    rate_limit_window_seconds: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    allowed_models: tuple[str, ...] = ()  # empty: every model the gateway serves
    oidc_group: str | None = None
    oidc_admin_group: str | None = None


# Every setting may change (PATCH), the id and creation time may not.
TEAM_FIELDS = tuple(field.name for field in attrs.fields(TeamSettings))


@attrs.frozen
class TeamRecord:
    id: uuid.UUID
    name: str
    monthly_budget_usd: float | None
    rate_limit_requests: int | None
    rate_limit_window_seconds: int | None
    tokens_per_minute: int | None
    max_concurrent_requests: int | None
    allowed_models: tuple[str, ...]
    oidc_group: str | None
    oidc_admin_group: str | None
    created_at: datetime
    spend_month_usd: float


_SELECT = """
SELECT t.id, t.name, t.monthly_budget_usd::float8 AS monthly_budget_usd, t.rate_limit_requests,
       t.rate_limit_window_seconds, t.tokens_per_minute, t.max_concurrent_requests,
       t.allowed_models, t.oidc_group, t.oidc_admin_group, t.created_at,
       (SELECT coalesce(sum(e.cost_usd), 0)::float8 FROM usage_events e
        JOIN api_keys k ON k.id = e.api_key_id
        WHERE k.team_id = t.id AND e.occurred_at >= $1) AS spend_month_usd
FROM teams t
"""


def _record(row: asyncpg.Record) -> TeamRecord:
    values = dict(row.items())
    values["allowed_models"] = tuple(values["allowed_models"])
    return TeamRecord(**values)


def _month() -> datetime:
    start = month_start(datetime.now(UTC))
    return datetime(start.year, start.month, 1, tzinfo=UTC)


def _column_values(settings: dict[str, Any]) -> list[Any]:
    values = []
    for name, value in settings.items():
        if name == "allowed_models":
            value = list(value)
        elif name == "monthly_budget_usd" and value is not None:
            value = Decimal(str(value))
        values.append(value)
    return values


async def create_team(conn: asyncpg.Connection, settings: TeamSettings) -> TeamRecord:
    wanted = attrs.asdict(settings)
    placeholders = ", ".join(f"${i}" for i in range(1, len(wanted) + 1))
    try:
        team_id = await conn.fetchval(
            f"INSERT INTO teams ({', '.join(wanted)}) VALUES ({placeholders}) RETURNING id",
            *_column_values(wanted),
        )
    except asyncpg.UniqueViolationError:
        raise TeamNameTaken(f"a team named {settings.name!r} already exists") from None
    return await find_team(conn, team_id)


async def find_team(conn: asyncpg.Connection, team_id: uuid.UUID) -> TeamRecord:
    row = await conn.fetchrow(_SELECT + "WHERE t.id = $2", _month(), team_id)
    if row is None:
        raise TeamNotFound(f"no team has id {team_id}")
    return _record(row)


async def list_teams(
    conn: asyncpg.Connection,
    *,
    limit: int | None = None,
    offset: int = 0,
    ids: list[uuid.UUID] | None = None,
) -> list[TeamRecord]:
    """Teams oldest first (only those in ``ids``, when given)."""
    rows = await conn.fetch(
        _SELECT
        + "WHERE ($4::uuid[] IS NULL OR t.id = ANY($4)) ORDER BY t.created_at, t.id "
        + "LIMIT $2 OFFSET $3",
        _month(),
        limit,
        offset,
        ids,
    )
    return [_record(row) for row in rows]


async def update_team(
    conn: asyncpg.Connection, team_id: uuid.UUID, changes: dict[str, Any]
) -> tuple[TeamRecord, TeamRecord]:
    """Apply ``changes`` (names from TEAM_FIELDS); returns the team before and after."""
    assignments = set_clause(changes, TEAM_FIELDS)
    async with conn.transaction():
        before = await find_team(conn, team_id)
        if not changes:
            return before, before
        try:
            await conn.execute(
                f"UPDATE teams SET {assignments} WHERE id = $1", team_id, *_column_values(changes)
            )
        except asyncpg.UniqueViolationError:
            raise TeamNameTaken(f"a team named {changes['name']!r} already exists") from None
        return before, await find_team(conn, team_id)


async def delete_team(conn: asyncpg.Connection, team_id: uuid.UUID) -> TeamRecord:
    """Delete a team without active keys; its revoked and expired keys leave it."""
    async with conn.transaction():
        before = await find_team(conn, team_id)
        # Locked, so a key created in the team meanwhile waits for this to finish (and then fails).
        await conn.execute("SELECT FROM teams WHERE id = $1 FOR UPDATE", team_id)
        active = await conn.fetchval(
            """
            SELECT count(*) FROM api_keys WHERE team_id = $1 AND is_active
              AND (expires_at IS NULL OR expires_at > now())
            """,
            team_id,
        )
        if active:
            raise TeamHasKeys(
                f"team {team_id} has {active} active key(s); revoke them or move them to another "
                "team first"
            )
        await conn.execute("UPDATE api_keys SET team_id = NULL WHERE team_id = $1", team_id)
        await conn.execute("DELETE FROM teams WHERE id = $1", team_id)
    return before


# The carried amount is for one month: a move in a later month starts from nothing.
_CARRY = """
UPDATE teams
SET carried_spend_usd = CASE WHEN carried_month = $3 THEN carried_spend_usd ELSE 0 END + $2,
    carried_month = $3
WHERE id = $1
"""


async def carry_key_spend(
    conn: asyncpg.Connection,
    key_id: uuid.UUID,
    left: uuid.UUID | None,
    joined: uuid.UUID | None,
) -> None:
    """A key moved from team ``left`` to team ``joined`` (either None: no team): its spend this
    month now counts for ``joined`` and no longer for ``left``.

    Spend still on its way to the ledger at the move stays with the team it was made in.
    """
    month = _month()
    spent = await conn.fetchval(
        """
        SELECT coalesce(sum(cost_usd), 0) FROM usage_events
        WHERE api_key_id = $1 AND occurred_at >= $2
        """,
        key_id,
        month,
    )
    if not spent:
        return
    for team_id, change in ((left, -spent), (joined, spent)):
        if team_id is not None:
            await conn.execute(_CARRY, team_id, change, month.date())
