"""Entries in Redis, shared by every replica: each under its own name with Redis's own expiry.

A name carries the key that stored the entry and the model it answered, so that clearing by
either is a SCAN of a pattern. A read or write that takes longer than ``budget_seconds`` (or
fails) raises :class:`CacheUnavailable`: the request goes on to the provider.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.cache.key import CacheKey
from llmgw.cache.store import CacheUnavailable

__all__ = ["RedisCacheStore"]

BUDGET_SECONDS = 0.05


class RedisCacheStore:
    def __init__(
        self, url: str, *, prefix: str = "llmgw:cache", budget_seconds: float = BUDGET_SECONDS
    ) -> None:
        self._client: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=budget_seconds
        )
        self._prefix = prefix
        self._budget = budget_seconds

    def _name(self, key: CacheKey) -> str:
        # The model hex-encoded: no glob character of a model name can widen a clear's pattern.
        return f"{self._prefix}:{key.key_id}:{key.model.encode().hex()}:{key.digest}"

    async def get(self, key: CacheKey) -> bytes | None:
        try:
            async with asyncio.timeout(self._budget):
                value = await self._client.get(self._name(key))
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error
        return value if isinstance(value, bytes) else None  # (never decoded: no decode_responses)

    async def put(self, key: CacheKey, value: bytes, ttl: float) -> None:
        try:
            async with asyncio.timeout(self._budget):
                await self._client.set(self._name(key), value, px=max(1, round(ttl * 1000)))
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error

    async def clear(self, *, key_id: str | None = None, model: str | None = None) -> int:
        pattern = ":".join(
            (
                self._prefix,
                key_id or "*",
                "*" if model is None else model.encode().hex(),
                "*",
            )
        )
        deleted = 0
        try:
            batch: list[bytes] = []
            async for name in self._client.scan_iter(match=pattern, count=500):
                batch.append(name)
                if len(batch) >= 500:
                    deleted += await self._client.unlink(*batch)
                    batch = []
            if batch:
                deleted += await self._client.unlink(*batch)
        except (RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error
        return deleted

    def bytes_held(self) -> None:
        return None  # Redis's own memory figures say it; a replica does not count them

    async def close(self) -> None:
        await self._client.aclose()
