"""Issuing, listing, revoking and rotating gateway keys: one implementation for the CLI and admin API.

Only a key's 12-character prefix and its SHA-256 digest are stored; the plaintext is returned once.
"""

from __future__ import annotations

import hmac
import uuid
from datetime import datetime
from typing import Any

import asyncpg
import attrs

from llmgw.key_format import (
    PREFIX_LENGTH,
    generate_key,
    hash_key,
    key_prefix,
    validate_key_text,
)
from llmgw.storage.teams import carry_key_spend
from llmgw.storage.updates import set_clause

__all__ = [
    "DEFAULT_RATE_LIMIT_REQUESTS",
    "DEFAULT_RATE_LIMIT_WINDOW_SECONDS",
    "ApiKeyRecord",
    "DuplicateKeyPrefix",
    "IssuedKey",
    "KeyNotFound",
    "KeySettings",
    "create_key",
    "find_key",
    "list_keys",
    "revoke_key",
    "rotate_key",
]

_COLUMNS = (
    "id, name, subject_id, prefix, rate_limit_requests, rate_limit_window_seconds, "
    "allowed_models, expires_at, tokens_per_minute, max_concurrent_requests, is_active, created_at, "
    "last_used_at, revoked_at, replaced_by, team_id, owner"
)


class DuplicateKeyPrefix(Exception):
    """Another key already starts with the same 12 characters."""


class KeyNotFound(Exception):
    """No key has that id or prefix."""


# A new key's request window unless its maker says otherwise (keys create, the admin API): a key
# carries its own limits; no gateway-wide setting changes them.
DEFAULT_RATE_LIMIT_REQUESTS = 60
DEFAULT_RATE_LIMIT_WINDOW_SECONDS = 60


@attrs.frozen
class KeySettings:
    name: str
    subject_id: uuid.UUID | None = None
    rate_limit_requests: int = DEFAULT_RATE_LIMIT_REQUESTS
    rate_limit_window_seconds: int = DEFAULT_RATE_LIMIT_WINDOW_SECONDS
    allowed_models: tuple[str, ...] = ()
    expires_at: datetime | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    team_id: uuid.UUID | None = None
    owner: str | None = None  # who made the key (the audit log's actor)


# What PATCH may change, and nothing else (subject and secrets are fixed for a key's life).
MUTABLE_FIELDS = (
    "name",
    "rate_limit_requests",
    "rate_limit_window_seconds",
    "allowed_models",
    "expires_at",
    "tokens_per_minute",
    "max_concurrent_requests",
    "team_id",
)


@attrs.frozen
class ApiKeyRecord:
    id: uuid.UUID
    name: str
    subject_id: uuid.UUID | None
    prefix: str
    rate_limit_requests: int
    rate_limit_window_seconds: int
    allowed_models: tuple[str, ...]
    expires_at: datetime | None
    tokens_per_minute: int | None
    max_concurrent_requests: int | None
    is_active: bool
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    replaced_by: uuid.UUID | None  # rotated: the key that replaced this one
    team_id: uuid.UUID | None
    owner: str | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ApiKeyRecord:
        values = dict(row.items())
        values["allowed_models"] = tuple(values["allowed_models"])
        return cls(**values)


@attrs.frozen
class IssuedKey:
    record: ApiKeyRecord
    plaintext: str = attrs.field(repr=False)


async def create_key(
    conn: asyncpg.Connection, settings: KeySettings, *, plaintext: str | None = None
) -> IssuedKey:
    key = validate_key_text(plaintext) if plaintext is not None else generate_key()
    try:
        row = await conn.fetchrow(
            f"""
            INSERT INTO api_keys
                (name, subject_id, prefix, key_hash, rate_limit_requests, rate_limit_window_seconds,
                 allowed_models, expires_at, tokens_per_minute, max_concurrent_requests,
                 team_id, owner)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
            RETURNING {_COLUMNS}
            """,
            settings.name,
            settings.subject_id,
            key_prefix(key),
            hash_key(key),
            settings.rate_limit_requests,
            settings.rate_limit_window_seconds,
            list(settings.allowed_models),
            settings.expires_at,
            settings.tokens_per_minute,
            settings.max_concurrent_requests,
            settings.team_id,
            settings.owner,
        )
    except asyncpg.UniqueViolationError as exc:
        raise DuplicateKeyPrefix(
            f"a key with prefix {key_prefix(key)!r} already exists; choose a key that differs "
            "in its first 12 characters"
        ) from exc
    assert row is not None
    return IssuedKey(ApiKeyRecord.from_row(row), key)


_STATE_CONDITIONS = {
    "all": "true",
    "active": "is_active AND (expires_at IS NULL OR expires_at > now())",
    "revoked": "NOT is_active",
    "expired": "is_active AND expires_at <= now()",
}
KEY_STATES = tuple(_STATE_CONDITIONS)


async def list_keys(
    conn: asyncpg.Connection,
    *,
    subject_id: uuid.UUID | None = None,
    team_id: uuid.UUID | None = None,
    owner: str | None = None,
    state: str = "all",
    limit: int | None = None,
    offset: int = 0,
    visible: tuple[list[uuid.UUID], str] | None = None,
) -> list[ApiKeyRecord]:
    """Keys oldest first, optionally of one subject, team or owner and in one state (KEY_STATES);
    ``visible``: only keys in those teams or of that owner (what a console role may see)."""
    rows = await conn.fetch(
        f"""
        SELECT {_COLUMNS} FROM api_keys
        WHERE ($1::uuid IS NULL OR subject_id = $1) AND ($4::uuid IS NULL OR team_id = $4)
          AND ($5::text IS NULL OR owner = $5) AND {_STATE_CONDITIONS[state]}
          AND ($6::uuid[] IS NULL OR team_id = ANY($6) OR owner = $7)
        ORDER BY created_at, id LIMIT $2 OFFSET $3
        """,
        subject_id,
        limit,
        offset,
        team_id,
        owner,
        None if visible is None else visible[0],
        None if visible is None else visible[1],
    )
    return [ApiKeyRecord.from_row(row) for row in rows]


async def find_key(conn: asyncpg.Connection, reference: str) -> ApiKeyRecord:
    """Find a key by its id (UUID), its 12-character prefix, or the whole key."""
    value: uuid.UUID | str
    try:
        condition, value = "id = $1", uuid.UUID(reference)
    except ValueError:
        condition, value = "prefix = $1", key_prefix(reference)
        if len(reference) > PREFIX_LENGTH:
            # A whole key must be that key, not only share its prefix. Never echo it: a secret.
            digest = await conn.fetchval("SELECT key_hash FROM api_keys WHERE prefix = $1", value)
            if digest is None or not hmac.compare_digest(digest, hash_key(reference)):
                raise KeyNotFound(f"no key matches the key given (prefix {value!r})") from None
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM api_keys WHERE {condition}", value)
    if row is None:
        raise KeyNotFound(f"no key has id or prefix {reference!r}; 'llmgw keys list' shows them")
    return ApiKeyRecord.from_row(row)


async def revoke_key(conn: asyncpg.Connection, reference: str) -> ApiKeyRecord:
    """Deactivate a key; revoking an already revoked key keeps its first revocation time."""
    record = await find_key(conn, reference)
    row = await conn.fetchrow(
        f"""
        UPDATE api_keys SET is_active = false, revoked_at = coalesce(revoked_at, now())
        WHERE id = $1 RETURNING {_COLUMNS}
        """,
        record.id,
    )
    assert row is not None
    return ApiKeyRecord.from_row(row)


async def update_key(
    conn: asyncpg.Connection, reference: str, changes: dict[str, Any]
) -> tuple[ApiKeyRecord, ApiKeyRecord]:
    """Apply ``changes`` (names from MUTABLE_FIELDS); returns the record before and after."""
    assignments = set_clause(changes, MUTABLE_FIELDS)
    async with conn.transaction():
        before = await find_key(conn, reference)
        if not changes:
            return before, before
        values = [list(v) if name == "allowed_models" else v for name, v in changes.items()]
        row = await conn.fetchrow(
            f"UPDATE api_keys SET {assignments} WHERE id = $1 RETURNING {_COLUMNS}",
            before.id,
            *values,
        )
        assert row is not None
        after = ApiKeyRecord.from_row(row)
        if after.team_id != before.team_id:
            await carry_key_spend(conn, after.id, before.team_id, after.team_id)
    return before, after


async def rotate_key(
    conn: asyncpg.Connection, reference: str, *, grace_seconds: float = 0
) -> tuple[ApiKeyRecord, IssuedKey]:
    """Issue a new key with the old one's settings; the old one stops working now or after a grace.

    Returns the old key's record as it is afterwards, and the new key.
    """
    async with conn.transaction():
        old = await find_key(conn, reference)
        issued = await create_key(
            conn,
            KeySettings(
                name=old.name,
                subject_id=old.subject_id,
                rate_limit_requests=old.rate_limit_requests,
                rate_limit_window_seconds=old.rate_limit_window_seconds,
                allowed_models=old.allowed_models,
                expires_at=old.expires_at,
                tokens_per_minute=old.tokens_per_minute,
                max_concurrent_requests=old.max_concurrent_requests,
                team_id=old.team_id,
                owner=old.owner,
            ),
        )
        if grace_seconds > 0:
            row = await conn.fetchrow(
                f"""
                UPDATE api_keys
                SET expires_at = least(coalesce(expires_at, 'infinity'), now() + make_interval(secs => $2)),
                    replaced_by = $3
                WHERE id = $1 RETURNING {_COLUMNS}
                """,
                old.id,
                float(grace_seconds),
                issued.record.id,
            )
        else:
            await revoke_key(conn, str(old.id))
            row = await conn.fetchrow(
                f"UPDATE api_keys SET replaced_by = $2 WHERE id = $1 RETURNING {_COLUMNS}",
                old.id,
                issued.record.id,
            )
        assert row is not None
        old_after = ApiKeyRecord.from_row(row)
    return old_after, issued
