"""Issuing, listing, revoking and rotating gateway keys: one implementation for the CLI and admin API.

Only a key's 12-character prefix and its SHA-256 digest are stored; the plaintext is returned once.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg
import attrs

from llmgw.auth.keys import generate_key, hash_key, key_prefix, validate_key_text

__all__ = [
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
    "is_active, created_at, last_used_at, revoked_at"
)


class DuplicateKeyPrefix(Exception):
    """Another key already starts with the same 12 characters."""


class KeyNotFound(Exception):
    """No key has that id or prefix."""


@attrs.frozen
class KeySettings:
    name: str
    subject_id: uuid.UUID | None = None
    rate_limit_requests: int = 60
    rate_limit_window_seconds: int = 60


@attrs.frozen
class ApiKeyRecord:
    id: uuid.UUID
    name: str
    subject_id: uuid.UUID | None
    prefix: str
    rate_limit_requests: int
    rate_limit_window_seconds: int
    is_active: bool
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ApiKeyRecord:
        return cls(**dict(row.items()))


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
                (name, subject_id, prefix, key_hash, rate_limit_requests, rate_limit_window_seconds)
            VALUES ($1, $2, $3, $4, $5, $6)
            RETURNING {_COLUMNS}
            """,
            settings.name,
            settings.subject_id,
            key_prefix(key),
            hash_key(key),
            settings.rate_limit_requests,
            settings.rate_limit_window_seconds,
        )
    except asyncpg.UniqueViolationError as exc:
        raise DuplicateKeyPrefix(
            f"a key with prefix {key_prefix(key)!r} already exists; choose a key that differs "
            "in its first 12 characters"
        ) from exc
    assert row is not None
    return IssuedKey(ApiKeyRecord.from_row(row), key)


async def list_keys(conn: asyncpg.Connection) -> list[ApiKeyRecord]:
    rows = await conn.fetch(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, prefix")
    return [ApiKeyRecord.from_row(row) for row in rows]


def _id_or_prefix(reference: str) -> tuple[str, Any]:
    try:
        return "id = $1", uuid.UUID(reference)
    except ValueError:
        return "prefix = $1", reference


async def find_key(conn: asyncpg.Connection, reference: str) -> ApiKeyRecord:
    """Find a key by its id (UUID) or its 12-character prefix."""
    condition, value = _id_or_prefix(reference)
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


async def rotate_key(conn: asyncpg.Connection, reference: str) -> IssuedKey:
    """Issue a new key with the old one's settings and revoke the old one, atomically."""
    async with conn.transaction():
        old = await find_key(conn, reference)
        issued = await create_key(
            conn,
            KeySettings(
                name=old.name,
                subject_id=old.subject_id,
                rate_limit_requests=old.rate_limit_requests,
                rate_limit_window_seconds=old.rate_limit_window_seconds,
            ),
        )
        await revoke_key(conn, str(old.id))
    return issued
