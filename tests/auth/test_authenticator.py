"""The authentication cache: bounded by size, not grown by unknown keys, never re-caching a revoke."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from llmgw.auth.authenticator import Authenticator
from llmgw.errors import AuthenticationFailed
from llmgw.storage import api_keys
from llmgw.storage.database import create_pool
from tests.processes import Clock, eventually


class CountingPool:
    """The real pool, counting lookups; ``during_lookup`` runs after the row was read."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.lookups = 0
        self.during_lookup: Any = None

    async def fetchrow(self, query: str, *args: Any) -> Any:
        self.lookups += 1
        row = await self.pool.fetchrow(query, *args)
        if self.during_lookup is not None:
            hook, self.during_lookup = self.during_lookup, None
            await hook()
        return row

    async def execute(self, query: str, *args: Any) -> Any:
        return await self.pool.execute(query, *args)


@pytest.fixture
async def pool(database_url: str, db: asyncpg.Connection) -> Any:
    real = await create_pool(database_url, min_size=1, max_size=2)
    yield CountingPool(real)
    await real.close()


async def started(pool: CountingPool, database_url: str, **options: Any) -> Authenticator:
    authenticator = Authenticator(pool.pool, database_url, **options)
    authenticator._pool = pool
    await authenticator.start()
    await eventually(lambda: authenticator._listening, within=4, what="the LISTEN connection")
    return authenticator


async def new_key(db: asyncpg.Connection, name: str = "cache") -> str:
    return (await api_keys.create_key(db, api_keys.KeySettings(name=name))).plaintext


def unknown_key() -> str:
    return "llmg_" + secrets.token_urlsafe(32)


async def test_unknown_keys_never_evict_a_known_one_and_their_cache_is_bounded(
    pool: CountingPool, database_url: str, db: asyncpg.Connection
) -> None:
    key = await new_key(db)
    authenticator = await started(pool, database_url, cache_size=4, unknown_cache_size=8)
    try:
        await authenticator.authenticate(key)
        for _ in range(100):
            with pytest.raises(AuthenticationFailed):
                await authenticator.authenticate(unknown_key())
        lookups = pool.lookups
        await authenticator.authenticate(key)
        assert pool.lookups == lookups, "the known key was evicted by unknown ones"
        assert len(authenticator._unknown) == 8
        assert len(authenticator._known) == 1
    finally:
        await authenticator.close()


async def test_known_keys_are_bounded_least_recently_used_first(
    pool: CountingPool, database_url: str, db: asyncpg.Connection
) -> None:
    keys = [await new_key(db, f"k{index}") for index in range(5)]
    authenticator = await started(pool, database_url, cache_size=3)
    try:
        for key in keys:
            await authenticator.authenticate(key)
        assert len(authenticator._known) == 3
        lookups = pool.lookups
        await authenticator.authenticate(keys[-1])  # still cached
        assert pool.lookups == lookups
        await authenticator.authenticate(keys[0])  # evicted first
        assert pool.lookups == lookups + 1
    finally:
        await authenticator.close()


async def test_a_revoke_landing_during_a_lookup_is_not_cached_over(
    pool: CountingPool, database_url: str, db: asyncpg.Connection
) -> None:
    key = await new_key(db)
    authenticator = await started(pool, database_url)
    try:

        async def revoke_and_wait_for_the_notification() -> None:
            generation = authenticator._generation
            await db.execute("UPDATE api_keys SET is_active = false, revoked_at = now()")
            await eventually(
                lambda: authenticator._generation != generation, within=2, what="the NOTIFY"
            )

        pool.during_lookup = revoke_and_wait_for_the_notification
        # The lookup read the row before the revoke committed: this one request still passes...
        await authenticator.authenticate(key)
        # ...but what it read was not cached, so the next one sees the revocation.
        with pytest.raises(AuthenticationFailed):
            await authenticator.authenticate(key)
    finally:
        await authenticator.close()


async def test_a_key_is_refused_once_the_wall_clock_passes_its_expiry_even_from_the_cache(
    pool: CountingPool, database_url: str, db: asyncpg.Connection
) -> None:
    expires = datetime.now(UTC) + timedelta(hours=1)
    settings = api_keys.KeySettings(name="expiring", expires_at=expires)
    key = (await api_keys.create_key(db, settings)).plaintext
    wall_clock = Clock(time.time())
    authenticator = await started(pool, database_url, wall_clock=wall_clock)
    try:
        await authenticator.authenticate(key)
        lookups = pool.lookups
        wall_clock.now = expires.timestamp() - 1
        await authenticator.authenticate(key)
        wall_clock.now = expires.timestamp()
        with pytest.raises(AuthenticationFailed):
            await authenticator.authenticate(key)
        assert pool.lookups == lookups  # the cached key: its expiry is checked on every use
    finally:
        await authenticator.close()
