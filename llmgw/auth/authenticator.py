"""Authenticate bearer tokens against ``api_keys``, served from a cache that revocation invalidates.

The cache keeps each prefix's row for ``cache_ttl`` seconds. Every change to ``api_keys`` (a trigger
NOTIFYs the prefix) drops that entry at once on every replica; while the LISTEN connection is down the
cache is bypassed, so a revocation is never missed for longer than the notification takes to arrive.
A lookup that was in flight when a notification arrived is answered but not cached (its row may
predate the change).

Memory is bounded: known keys in an LRU of ``cache_size`` entries, unknown prefixes (anyone can
send those) in a separate, smaller LRU, so unauthenticated traffic never evicts a real key's entry.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from datetime import date

import asyncpg
import attrs

from llmgw.background import cancel_and_wait
from llmgw.errors import AuthenticationFailed
from llmgw.key_format import hash_key, is_plausible_key, key_prefix
from llmgw.storage.database import (
    API_KEY_CHANGES_CHANNEL,
    DATABASE_DOWN_ERRORS,
    DATABASE_TIMEOUT_SECONDS,
    database_errors,
)

__all__ = ["AuthenticatedKey", "Authenticator", "TeamLimits"]

log = logging.getLogger(__name__)

_LOOKUP = """
SELECT k.id, k.subject_id, k.key_hash, k.rate_limit_requests, k.rate_limit_window_seconds,
       extract(epoch FROM k.expires_at)::float8 AS expires_at_epoch, k.allowed_models,
       k.tokens_per_minute, k.max_concurrent_requests,
       s.monthly_budget_usd::float8 AS monthly_budget_usd,
       k.team_id, t.rate_limit_requests AS team_rate_limit_requests,
       t.rate_limit_window_seconds AS team_rate_limit_window_seconds,
       t.tokens_per_minute AS team_tokens_per_minute,
       t.max_concurrent_requests AS team_max_concurrent_requests,
       t.monthly_budget_usd::float8 AS team_monthly_budget_usd,
       t.allowed_models AS team_allowed_models,
       t.carried_spend_usd::float8 AS team_carried_spend_usd,
       t.carried_month AS team_carried_month
FROM api_keys k LEFT JOIN subjects s ON s.subject_id = k.subject_id
     LEFT JOIN teams t ON t.id = k.team_id
WHERE k.prefix = $1 AND k.is_active AND k.revoked_at IS NULL
"""
_TOUCH = "UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1::uuid[])"
# Compared against when no row matches, so an unknown prefix costs the same as a wrong secret.
_DUMMY_HASH = hash_key("llmg_no-such-key-exists-here")


@attrs.frozen(slots=True)
class AuthenticatedKey:
    """The key a request was authenticated with; never holds the plaintext."""

    id: uuid.UUID
    prefix: str
    subject_id: uuid.UUID | None
    rate_limit_requests: int
    rate_limit_window_seconds: int
    expires_at_epoch: float | None = None  # Unix time after which the key is refused
    allowed_models: frozenset[str] = frozenset()  # empty: every model
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    # The subject's cap, read with the key (a change to it is announced like a key change).
    monthly_budget_usd: float | None = None
    # The key's team and its limits, read with the key (a change to the team is announced like a
    # key change): a request is admitted only when the key's limits and its team's all admit it.
    team: TeamLimits | None = None

    def allows_model(self, model: str) -> bool:
        """Allowed models are the intersection of the key's list and its team's (empty: all)."""
        if self.allowed_models and model not in self.allowed_models:
            return False
        return self.team is None or self.team.allows_model(model)

    @property
    def restricts_models(self) -> bool:
        return bool(self.allowed_models) or bool(self.team and self.team.allowed_models)

    @property
    def allowlist(self) -> frozenset[str]:
        """The models the key may use, when it restricts_models."""
        team = self.team.allowed_models if self.team else frozenset()
        if self.allowed_models and team:
            return self.allowed_models & team
        return self.allowed_models or team


@attrs.frozen(slots=True)
class TeamLimits:
    """A team's limits over all its keys (None: no such limit)."""

    id: uuid.UUID
    rate_limit_requests: int | None = None
    rate_limit_window_seconds: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    monthly_budget_usd: float | None = None
    allowed_models: frozenset[str] = frozenset()  # empty: every model
    # Spend this month of keys that joined the team, made before they joined (less that of keys
    # that left, made while in it): it counts against the budget (llmgw.storage.teams).
    carried_spend_usd: float = 0.0
    carried_month: date | None = None  # the month it is for; in any other it is nothing

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


@attrs.define(slots=True)
class _CacheEntry:
    key: AuthenticatedKey | None
    key_hash: bytes
    expires_at: float


class _LRU:
    """At most ``size`` entries; the least recently used one goes first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: collections.OrderedDict[str, _CacheEntry] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prefix: str) -> _CacheEntry | None:
        entry = self._entries.get(prefix)
        if entry is not None:
            self._entries.move_to_end(prefix)
        return entry

    def put(self, prefix: str, entry: _CacheEntry) -> None:
        self._entries[prefix] = entry
        self._entries.move_to_end(prefix)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def pop(self, prefix: str) -> None:
        self._entries.pop(prefix, None)

    def clear(self) -> None:
        self._entries.clear()


def _team(row: asyncpg.Record) -> TeamLimits:
    return TeamLimits(
        id=row["team_id"],
        rate_limit_requests=row["team_rate_limit_requests"],
        rate_limit_window_seconds=row["team_rate_limit_window_seconds"],
        tokens_per_minute=row["team_tokens_per_minute"],
        max_concurrent_requests=row["team_max_concurrent_requests"],
        monthly_budget_usd=row["team_monthly_budget_usd"],
        allowed_models=frozenset(row["team_allowed_models"]),
        carried_spend_usd=row["team_carried_spend_usd"],
        carried_month=row["team_carried_month"],
    )


class Authenticator:
    def __init__(
        self,
        pool: asyncpg.Pool,
        database_url: str,
        *,
        cache_ttl: float = 10.0,
        cache_size: int = 10_000,
        unknown_cache_size: int = 1_000,
        last_used_interval: float = 60.0,
        database_timeout: float = DATABASE_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = pool
        self._database_url = database_url
        self._cache_ttl = cache_ttl
        self._last_used_interval = last_used_interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._database_timeout = database_timeout
        self._known = _LRU(cache_size)
        self._unknown = _LRU(unknown_cache_size)
        # Bumped by every notification and listener change: a lookup that saw it move while in
        # flight does not cache what it read.
        self._generation = 0
        self._listening = False
        self._last_touched: dict[uuid.UUID, float] = {}
        self._to_touch: set[uuid.UUID] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: asyncpg.Connection | None = None

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen_forever(), name="llmgw-auth-listen"),
            asyncio.create_task(self._touch_forever(), name="llmgw-auth-last-used"),
        ]

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        await self._flush_last_used()
        if self._listener is not None and not self._listener.is_closed():
            try:
                await self._listener.close(timeout=self._database_timeout)
            except DATABASE_DOWN_ERRORS:
                self._listener.terminate()

    async def authenticate(self, token: str) -> AuthenticatedKey:
        if not is_plausible_key(token):
            raise AuthenticationFailed()
        prefix = key_prefix(token)
        now = self._clock()
        entry = self._known.get(prefix) or self._unknown.get(prefix)
        if entry is None or entry.expires_at <= now or not self._listening:
            entry = await self._load(prefix, now)
        presented = hash_key(token)
        if not hmac.compare_digest(presented, entry.key_hash) or entry.key is None:
            raise AuthenticationFailed()
        expires_at = entry.key.expires_at_epoch
        if expires_at is not None and expires_at <= self._wall_clock():
            raise AuthenticationFailed()
        self._note_use(entry.key.id, now)
        return entry.key

    async def _load(self, prefix: str, now: float) -> _CacheEntry:
        generation = self._generation
        with database_errors():
            row = await self._pool.fetchrow(_LOOKUP, prefix)
        if row is None:
            entry = _CacheEntry(None, _DUMMY_HASH, now + self._cache_ttl)
            self._store(prefix, entry, generation, self._unknown)
        else:
            key = AuthenticatedKey(
                id=row["id"],
                prefix=prefix,
                subject_id=row["subject_id"],
                rate_limit_requests=row["rate_limit_requests"],
                rate_limit_window_seconds=row["rate_limit_window_seconds"],
                expires_at_epoch=row["expires_at_epoch"],
                allowed_models=frozenset(row["allowed_models"]),
                tokens_per_minute=row["tokens_per_minute"],
                max_concurrent_requests=row["max_concurrent_requests"],
                monthly_budget_usd=row["monthly_budget_usd"],
                team=None if row["team_id"] is None else _team(row),
            )
            entry = _CacheEntry(key, bytes(row["key_hash"]), now + self._cache_ttl)
            self._store(prefix, entry, generation, self._known)
        return entry

    def _store(self, prefix: str, entry: _CacheEntry, generation: int, cache: _LRU) -> None:
        if generation != self._generation:
            return  # a change was announced while the row was read: it may already be stale
        self._known.pop(prefix)
        self._unknown.pop(prefix)
        cache.put(prefix, entry)

    def _note_use(self, key_id: uuid.UUID, now: float) -> None:
        last = self._last_touched.get(key_id)
        if last is None or now - last >= self._last_used_interval:
            self._last_touched[key_id] = now
            self._to_touch.add(key_id)

    async def _touch_forever(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self._last_used_interval))
            await self._flush_last_used()

    async def _flush_last_used(self) -> None:
        if not self._to_touch:
            return
        ids, self._to_touch = list(self._to_touch), set()
        try:
            await self._pool.execute(_TOUCH, ids)
        except DATABASE_DOWN_ERRORS:
            # last_used_at is advisory; try again on the next tick rather than fail anything.
            self._to_touch.update(ids)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, prefix: str) -> None:
        self._generation += 1
        self._known.pop(prefix)
        self._unknown.pop(prefix)

    def _forget_everything(self) -> None:
        self._generation += 1
        self._known.clear()
        self._unknown.clear()

    def _on_listener_lost(self, _conn: object) -> None:
        self._listening = False
        self._forget_everything()

    async def _listen_forever(self) -> None:
        while True:
            if self._listener is None or self._listener.is_closed():
                self._listening = False
                try:
                    self._listener = await self._connect_listener()
                except DATABASE_DOWN_ERRORS as exc:
                    log.warning(
                        "auth cache: LISTEN connection failed (%s); retrying", type(exc).__name__
                    )
                else:
                    self._forget_everything()
                    self._listening = True
            await asyncio.sleep(0.5)

    async def _connect_listener(self) -> asyncpg.Connection:
        conn: asyncpg.Connection = await asyncpg.connect(
            self._database_url, timeout=self._database_timeout
        )
        try:
            async with asyncio.timeout(self._database_timeout):
                conn.add_termination_listener(self._on_listener_lost)
                await conn.add_listener(API_KEY_CHANGES_CHANNEL, self._on_notify)
        except BaseException:
            conn.terminate()
            raise
        return conn
