"""Stored Responses API responses: what ``previous_response_id`` continues and ``GET /v1/responses``
returns, each visible only to the key that made it, until it expires.

A response is written before its answer is sent, so the answer can say whether it was kept: a write
that fails (a full disk, the database down) answers ``store: false``. The write itself runs as its
own task, so a caller who hangs up meanwhile does not cut it short; a read of an id this process is
still writing waits for that write.
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
# As UTF-8 bytes: their length is what the history weighs (a chain is bounded by it).
_SELECT = """
SELECT convert_to(input_items::text, 'UTF8'), convert_to(response::text, 'UTF8') FROM responses
WHERE id = $1 AND api_key_id = $2 AND expires_at > now()
"""
_DELETE = "DELETE FROM responses WHERE id = $1 AND api_key_id = $2 AND expires_at > now()"
# The ids the gateway hands out; anything else (a NUL byte, say) is known not to exist.
_RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")


@attrs.frozen
class StoredResponse:
    input_items: list[dict[str, Any]]
    response: dict[str, Any]
    size: int  # bytes of JSON as stored: about what its history adds to a request continuing it

    def history(self) -> list[dict[str, Any]]:
        """The items a response continuing this one starts from: its input, then its output."""
        return [*self.input_items, *self.response.get("output", [])]


class ResponseStore:
    def __init__(self, pool: asyncpg.Pool, *, retention: timedelta) -> None:
        self._pool = pool
        self._retention = retention
        self._writing: dict[str, asyncio.Task[bool]] = {}

    async def save(
        self,
        key_id: uuid.UUID,
        response: dict[str, Any],
        input_items: Sequence[dict[str, Any]],
    ) -> bool:
        """Store ``response`` for ``key_id``; False when it could not be (logged, not raised)."""
        response_id = response["id"]
        task = asyncio.get_running_loop().create_task(
            self._insert(
                response_id, key_id, orjson.dumps(list(input_items)), orjson.dumps(response)
            )
        )
        self._writing[response_id] = task
        task.add_done_callback(lambda _done: self._writing.pop(response_id, None))
        return await asyncio.shield(task)

    async def _insert(
        self, response_id: str, key_id: uuid.UUID, input_items: bytes, response: bytes
    ) -> bool:
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
            log.warning(
                "a response could not be stored (%s), answered with store false: %s",
                type(exc).__name__,
                response_id,
            )
            return False
        return True

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
        input_items, response = row
        return StoredResponse(
            orjson.loads(input_items), orjson.loads(response), len(input_items) + len(response)
        )

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
