"""Stored Responses API responses: what ``previous_response_id`` continues and ``GET /v1/responses``
returns, each visible only to the key that made it, until it expires.

Writes leave the request path: ``ResponseStore.save`` starts the INSERT and returns at once. A read
of an id this process is still writing waits for that write, so a client's next turn always finds
its previous response here; another replica may briefly not (documented).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import attrs
import orjson

from llmgw.storage.database import DATABASE_DOWN_ERRORS, database_errors

__all__ = ["ResponseStore", "StoredResponse", "prune_responses"]

log = logging.getLogger(__name__)

_INSERT = """
INSERT INTO responses (id, api_key_id, created_at, expires_at, input_items, response)
VALUES ($1, $2, now(), now() + $3::interval, $4::jsonb, $5::jsonb)
ON CONFLICT (id) DO NOTHING
"""
_SELECT = """
SELECT input_items::text, response::text FROM responses
WHERE id = $1 AND api_key_id = $2 AND expires_at > now()
"""
_DELETE = "DELETE FROM responses WHERE id = $1 AND api_key_id = $2 AND expires_at > now()"
# The ids the gateway hands out; anything else (a NUL byte, say) is known not to exist.
_RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")


@attrs.frozen
class StoredResponse:
    input_items: list[dict[str, Any]]
    response: dict[str, Any]

    def history(self) -> list[dict[str, Any]]:
        """The items a response continuing this one starts from: its input, then its output."""
        return [*self.input_items, *self.response.get("output", [])]


class ResponseStore:
    def __init__(self, pool: asyncpg.Pool, *, retention: timedelta) -> None:
        self._pool = pool
        self._retention = retention
        self._writing: dict[str, asyncio.Task[None]] = {}

    def save(
        self,
        key_id: uuid.UUID,
        response: dict[str, Any],
        input_items: Sequence[dict[str, Any]],
    ) -> None:
        """Store ``response`` for ``key_id`` in the background (a failure is logged, not raised)."""
        response_id = response["id"]
        task = asyncio.get_running_loop().create_task(
            self._insert(
                response_id, key_id, orjson.dumps(list(input_items)), orjson.dumps(response)
            )
        )
        self._writing[response_id] = task
        task.add_done_callback(lambda _done: self._writing.pop(response_id, None))

    async def _insert(
        self, response_id: str, key_id: uuid.UUID, input_items: bytes, response: bytes
    ) -> None:
        try:
            async with self._pool.acquire() as connection:
                await connection.execute(
                    _INSERT,
                    response_id,
                    key_id,
                    self._retention,
                    input_items.decode(),
                    response.decode(),
                )
        except (*DATABASE_DOWN_ERRORS, asyncpg.PostgresError) as exc:
            log.warning("a response could not be stored (%s): %s", type(exc).__name__, response_id)

    async def _written(self, response_id: str) -> None:
        pending = self._writing.get(response_id)
        if pending is not None:
            await asyncio.shield(pending)

    async def load(self, response_id: str, key_id: uuid.UUID) -> StoredResponse | None:
        """The response if ``key_id`` made it and it has not expired; None otherwise."""
        if not _RESPONSE_ID.fullmatch(response_id):
            return None
        await self._written(response_id)
        with database_errors():
            async with self._pool.acquire() as connection:
                row = await connection.fetchrow(_SELECT, response_id, key_id)
        if row is None:
            return None
        return StoredResponse(orjson.loads(row[0]), orjson.loads(row[1]))

    async def delete(self, response_id: str, key_id: uuid.UUID) -> bool:
        if not _RESPONSE_ID.fullmatch(response_id):
            return False
        await self._written(response_id)
        with database_errors():
            async with self._pool.acquire() as connection:
                status: str = await connection.execute(_DELETE, response_id, key_id)
        return status != "DELETE 0"

    async def close(self) -> None:
        """Wait for the writes still under way (graceful shutdown)."""
        pending = list(self._writing.values())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def prune_responses(conn: asyncpg.Connection) -> int:
    """Delete expired responses; returns how many were deleted."""
    status: str = await conn.execute("DELETE FROM responses WHERE expires_at <= now()")
    return int(status.rsplit(" ", 1)[-1])
