"""Entries in Redis, shared by every replica: each under its own name with Redis's own expiry.

An entry's name carries the model it answered (clearing by model is a SCAN of a pattern), and
each key has a set of the names it stored (clearing by key reads that set); the key is not in the
name, since under a wider scope other keys read the same entry. A read or write that takes longer
than ``budget_seconds`` (or fails) raises :class:`CacheUnavailable`: the request goes on to the
provider.

A replica fetching an answer claims it for every replica (a name holding the claim's token,
expiring after ``claim_seconds`` unless renewed, so a replica that dies holds it only briefly);
the others' identical requests watch for the entry instead of calling the provider too.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.cache.entry import Entry, decode_entry
from llmgw.cache.key import CacheKey
from llmgw.cache.store import CacheUnavailable, Claim

__all__ = ["RedisCacheStore"]

BUDGET_SECONDS = 0.05
CLAIM_SECONDS = 5.0
_OPEN_SECONDS = 2.0

# A claim is renewed or given up only by its holder (its token): a renewal or give-up that came
# late must not prolong or delete a claim taken since.
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then"
    " return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
)
_GIVE_UP = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


class RedisCacheStore:
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "llmgw:cache",
        budget_seconds: float = BUDGET_SECONDS,
        claim_seconds: float = CLAIM_SECONDS,
    ) -> None:
        self._client: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=budget_seconds
        )
        self._prefix = prefix
        self._budget = budget_seconds
        self._claim_ms = max(1, round(claim_seconds * 1000))
        self._renew = self._client.register_script(_RENEW)
        self._give_up = self._client.register_script(_GIVE_UP)
        self._claims: dict[str, asyncio.Task[None]] = {}  # by token: each claim's renewal

    def _name(self, key: CacheKey) -> str:
        # The model hex-encoded: no glob character of a model name can widen a clear's pattern.
        return f"{self._prefix}:e:{key.model.encode().hex()}:{key.digest}"

    def _stored_by(self, key_id: str) -> str:
        return f"{self._prefix}:k:{key_id}"

    def _claim(self, key: CacheKey) -> str:
        return f"{self._prefix}:f:{key.digest}"

    async def get(self, key: CacheKey) -> Entry | None:
        try:
            async with asyncio.timeout(self._budget):
                value = await self._client.get(self._name(key))
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error
        # (bytes: the client has no decode_responses)
        return decode_entry(value) if isinstance(value, bytes) else None

    async def put(self, key: CacheKey, entry: Entry, value: bytes) -> None:
        try:
            name, ttl_ms = self._name(key), max(1, round(entry.ttl * 1000))
            stored_by = self._stored_by(key.key_id)
            async with asyncio.timeout(self._budget), self._client.pipeline() as pipe:
                pipe.set(name, value, px=ttl_ms)
                pipe.sadd(stored_by, name)
                # The set outlives its newest entry; names of expired entries in it are harmless.
                pipe.pexpire(stored_by, ttl_ms, gt=True)
                pipe.pexpire(stored_by, ttl_ms, nx=True)
                await pipe.execute()
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error

    async def clear(self, *, key_id: str | None = None, model: str | None = None) -> int:
        model_part = "*" if model is None else model.encode().hex()
        try:
            if key_id is not None:
                names: set[bytes] = set(await self._client.smembers(self._stored_by(key_id)))  # type: ignore[arg-type]
                if model is not None:
                    names = {n for n in names if n.startswith(self._name_prefix(model_part))}
                return await self._unlink(list(names))
            deleted = 0
            batch: list[bytes] = []
            async for name in self._client.scan_iter(
                match=f"{self._prefix}:e:{model_part}:*", count=500
            ):
                batch.append(name)
                if len(batch) >= 500:
                    deleted += await self._unlink(batch)
                    batch = []
            return deleted + await self._unlink(batch)
        except (RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error

    def _name_prefix(self, model_hex: str) -> bytes:
        return f"{self._prefix}:e:{model_hex}:".encode()

    async def _unlink(self, names: list[bytes]) -> int:
        if not names:
            return 0
        deleted: int = await self._client.unlink(*names)
        return deleted

    def bytes_held(self) -> None:
        return None  # Redis's own memory figures say it; a replica does not count them

    async def lead(self, key: CacheKey) -> Claim | None:
        claim = Claim(key, uuid.uuid4().hex)
        name = self._claim(key)
        try:
            async with asyncio.timeout(self._budget):
                claimed = await self._client.set(name, claim.token, nx=True, px=self._claim_ms)
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error
        if not claimed:
            return None
        self._claims[claim.token] = asyncio.ensure_future(self._keep(name, claim.token))
        return claim

    async def _keep(self, name: str, token: str) -> None:
        """Renew a claim while its answer is fetched (an answer can take minutes)."""
        interval = self._claim_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                async with asyncio.timeout(interval):
                    if not await self._renew(keys=[name], args=[token, self._claim_ms]):
                        return  # it expired meanwhile: another replica may lead now
            except (TimeoutError, RedisError, OSError):
                continue  # tried again; if Redis stays away, the claim expires

    async def landed(self, claim: Claim) -> None:
        renewing = self._claims.pop(claim.token, None)
        if renewing is not None:
            renewing.cancel()
        try:
            async with asyncio.timeout(self._budget):
                await self._give_up(keys=[self._claim(claim.key)], args=[claim.token])
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error

    async def watch(self, key: CacheKey) -> tuple[Entry | None, bool]:
        try:
            async with (
                asyncio.timeout(self._budget),
                self._client.pipeline(transaction=False) as pipe,
            ):
                pipe.get(self._name(key))
                pipe.exists(self._claim(key))
                value, claimed = await pipe.execute()
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error
        return (decode_entry(value) if isinstance(value, bytes) else None), bool(claimed)

    async def open(self) -> None:
        # The connection made now (and the client's first-use setup done), where a request's
        # 50 ms budget would otherwise pay for it.
        try:
            async with asyncio.timeout(_OPEN_SECONDS):
                await self._client.ping()
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error

    async def close(self) -> None:
        renewals = list(self._claims.values())
        self._claims.clear()
        for renewing in renewals:
            renewing.cancel()
        for renewing in renewals:
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        await self._client.aclose()
