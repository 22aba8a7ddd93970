"""A throwaway database on a PostgreSQL server reached over TCP, as a container reaches its own.

The suite's embedded server listens on a Unix socket inside its data directory, which only its
own user may enter; the artifact checks run commands as other users, so they use the machine's
server (``LLMGW_ARTIFACT_POSTGRES``, by default 127.0.0.1:5432 with trust authentication).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from tests.conftest import with_database

__all__ = ["ADMIN_URL", "throwaway_database"]

ADMIN_URL = os.environ.get(
    "LLMGW_ARTIFACT_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


async def _admin(admin_url: str, *statements: str) -> None:
    connection = await asyncpg.connect(admin_url, timeout=10)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


@contextmanager
def throwaway_database(admin_url: str = ADMIN_URL) -> Iterator[str]:
    """A new empty database (its URL), dropped afterwards."""
    name = f"llmgw_artifact_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(admin_url, f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(admin_url, name)
    finally:
        asyncio.run(_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
