"""Fixed windows in Redis: one atomic Lua script per request, the same semantics as Postgres.

The script reads the clock of the Redis server (``TIME``), so every replica agrees on window
boundaries, and it refuses without incrementing once the window is full, so counts stay exact.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import ServiceUnavailable
from llmgw.ratelimit.base import RateLimitDecision

__all__ = ["RedisRateLimiter"]

_HIT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local window = tonumber(ARGV[2])
local start = math.floor(now / window) * window
local key = KEYS[1] .. ':' .. window .. ':' .. start
local reset = tostring(start + window - now)
local count = tonumber(redis.call('GET', key) or '0')
if count >= tonumber(ARGV[1]) then
    return {0, count, reset}
end
count = redis.call('INCR', key)
if count == 1 then
    redis.call('EXPIREAT', key, start + window + 60)
end
return {1, count, reset}
"""


class RedisRateLimiter:
    def __init__(self, url: str, *, key_prefix: str = "llmgw:ratelimit") -> None:
        self._client: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=2.0
        )
        self._script: Any = self._client.register_script(_HIT)
        self._key_prefix = key_prefix

    async def start(self) -> None:
        """Nothing to start: windows expire by themselves (EXPIREAT), so there is no pruning."""

    async def close(self) -> None:
        await self._client.aclose()

    async def hit(self, key: AuthenticatedKey) -> RateLimitDecision:
        limit = key.rate_limit_requests
        try:
            allowed, count, reset = await self._script(
                keys=[f"{self._key_prefix}:{key.id}"],
                args=[limit, key.rate_limit_window_seconds],
            )
        except (RedisError, OSError) as exc:
            # Fail closed: without the shared count no replica can know whether the key is over.
            raise ServiceUnavailable(
                "The gateway cannot reach its rate-limit store right now; retry in a few seconds.",
                code="rate_limit_store_unavailable",
            ) from exc
        return RateLimitDecision(
            allowed=bool(allowed),
            limit=limit,
            remaining=max(0, limit - int(count)),
            reset_seconds=float(reset),
        )
