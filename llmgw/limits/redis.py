"""Limits in Redis: one atomic Lua call per request, the same semantics as Postgres.

Scripts read the clock of the Redis server (``TIME``), so every replica agrees on window boundaries
and lease expiry. A counter ``C`` is three keys: the hash ``C`` (``used``, ``reserved``), the sorted
set ``C:l`` of its leases by expiry, and the hash ``C:a`` of each lease's amount; a cancelled
admission is a key ``<prefix>:cancelled:<lease id>`` that expires. Keys are derived from the ones
passed, so this needs a single Redis server (not Cluster).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.errors import ServiceUnavailable
from llmgw.limits.store import (
    Admission,
    AdmissionResult,
    Charge,
    RateLimitDecision,
    Window,
)

__all__ = ["RedisLimitStore"]

log = logging.getLogger(__name__)

# Shared by the scripts: the clock, giving back a lease (settled, cancelled or expired), settling.
_PRELUDE = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local function give_back(counter, lease)
    local given = redis.call('HGET', counter .. ':a', lease)
    redis.call('ZREM', counter .. ':l', lease)
    if given then
        redis.call('HDEL', counter .. ':a', lease)
        redis.call('HINCRBYFLOAT', counter, 'reserved', -tonumber(given))
    end
end
local function settle(counter, lease, actual)
    if redis.call('EXISTS', counter) == 1 then
        give_back(counter, lease)
        if actual ~= 0 then
            redis.call('HINCRBYFLOAT', counter, 'used', actual)
        end
    end
end
local function expire_leases(counter)
    local expired = redis.call('ZRANGEBYSCORE', counter .. ':l', '-inf', '(' .. now)
    for _, lease in ipairs(expired) do
        give_back(counter, lease)
    end
end
local function taken(counter)
    local used = tonumber(redis.call('HGET', counter, 'used') or '0')
    local reserved = tonumber(redis.call('HGET', counter, 'reserved') or '0')
    return used + math.max(0, reserved), used, math.max(0, reserved)
end
"""

# KEYS[1]: the key's window prefix ('' for none); KEYS[2]: the lease's cancel mark; KEYS[3..m+2]:
# the m counters; KEYS[m+3..]: the counters of the settlements that ride along. ARGV: window limit
# ('' for none), window seconds, lease id, lease seconds, m, then per counter: cap, amount, keep
# seconds, then per settlement: lease id, actual. The settlements are applied first, whatever the
# admission's outcome. Returns {window allowed, count, reset, refused counter index, and (admitted)
# each counter's used + reserved with it} (index -1: the lease was cancelled, nothing counted).
_HIT_WINDOW = """
local function window_state(prefix, limit, seconds)
    local start = math.floor(now / seconds) * seconds
    local key = prefix .. ':' .. seconds .. ':' .. start
    return key, tonumber(redis.call('GET', key) or '0'), start + seconds - now, start + seconds
end
local function count_window(key, ends)
    local count = redis.call('INCR', key)
    if count == 1 then
        redis.call('EXPIREAT', key, math.ceil(ends) + 60)
    end
    return count
end
"""

_HIT = (
    _PRELUDE
    + _HIT_WINDOW
    + """
local limit = tonumber(ARGV[1])
local key, count, reset, ends = window_state(KEYS[1], limit, tonumber(ARGV[2]))
if count >= limit then
    return {0, count, tostring(reset)}
end
return {1, count_window(key, ends), tostring(reset)}
"""
)

_ADMIT = (
    _PRELUDE
    + _HIT_WINDOW
    + """
local m = tonumber(ARGV[5])
for i = m + 3, #KEYS do
    local at = 6 + 3 * m + 2 * (i - m - 3)
    settle(KEYS[i], ARGV[at], tonumber(ARGV[at + 1]))
end
if redis.call('EXISTS', KEYS[2]) == 1 then
    return {0, 0, '0', -1}
end
local window_key, count, reset, ends = nil, 0, 0, 0
local limit = tonumber(ARGV[1])
if limit then
    window_key, count, reset, ends = window_state(KEYS[1], limit, tonumber(ARGV[2]))
    if count >= limit then
        return {0, count, tostring(reset), 0}
    end
end
local lease, lease_seconds = ARGV[3], tonumber(ARGV[4])
for i = 3, m + 2 do
    local at = 6 + (i - 3) * 3
    expire_leases(KEYS[i])
    if taken(KEYS[i]) + tonumber(ARGV[at + 1]) > tonumber(ARGV[at]) then
        return {1, count, tostring(reset), i - 2}
    end
end
if window_key then
    count = count_window(window_key, ends)
end
local totals = {}
for i = 3, m + 2 do
    local at = 6 + (i - 3) * 3
    local counter, amount, keep = KEYS[i], ARGV[at + 1], math.ceil(tonumber(ARGV[at + 2]))
    redis.call('HINCRBYFLOAT', counter, 'reserved', amount)
    totals[#totals + 1] = tostring(taken(counter))
    redis.call('ZADD', counter .. ':l', now + lease_seconds, lease)
    redis.call('HSET', counter .. ':a', lease, amount)
    for _, key in ipairs({counter, counter .. ':l', counter .. ':a'}) do
        if redis.call('TTL', key) < keep then
            redis.call('EXPIRE', key, keep)
        end
    end
end
return {1, count, tostring(reset), 0, totals}
"""
)

# KEYS: counters; ARGV: per counter, the lease id and the actual amount.
_SETTLE = (
    _PRELUDE
    + """
for i = 1, #KEYS do
    settle(KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i]))
end
return 0
"""
)

# KEYS: counters; ARGV: per counter, the lease id and the amount used (moved from the lease to
# ``used``; the lease keeps the rest).
_USE = (
    _PRELUDE
    + """
for i = 1, #KEYS do
    local counter, lease, actual = KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i])
    if redis.call('EXISTS', counter) == 1 then
        local given = redis.call('HGET', counter .. ':a', lease)
        if given then
            local moved = math.min(tonumber(given), actual)
            redis.call('HSET', counter .. ':a', lease, tostring(tonumber(given) - moved))
            redis.call('HINCRBYFLOAT', counter, 'reserved', -moved)
        end
        redis.call('HINCRBYFLOAT', counter, 'used', actual)
    end
end
return 0
"""
)

# KEYS: counters; ARGV[1]: seconds; ARGV[2..]: the lease id for each counter.
_RENEW = (
    _PRELUDE
    + """
for i = 1, #KEYS do
    redis.call('ZADD', KEYS[i] .. ':l', 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
end
return 0
"""
)

# KEYS[1..n]: the cancel marks of n leases, then counters; ARGV: seconds, n, then the lease id of
# each counter. Marks first: an admission that arrives later sees its mark and is refused.
_CANCEL = (
    _PRELUDE
    + """
local seconds, n = math.ceil(tonumber(ARGV[1])), tonumber(ARGV[2])
for i = 1, n do
    redis.call('SET', KEYS[i], '1', 'EX', seconds)
end
for i = n + 1, #KEYS do
    give_back(KEYS[i], ARGV[i - n + 2])
end
return 0
"""
)

_USAGE = (
    _PRELUDE
    + """
expire_leases(KEYS[1])
local _, used, reserved = taken(KEYS[1])
return {tostring(used), tostring(reserved)}
"""
)


class _Reachability:
    """Turns Redis errors into 503s, and logs an outage once when it starts and once when it ends
    (every request fails while it lasts; a line per request would bury the two that matter)."""

    def __init__(self) -> None:
        self._down_since: float | None = None

    @contextmanager
    def errors(self) -> Iterator[None]:
        try:
            yield
        except (RedisError, OSError) as exc:
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "the rate-limit store (Redis) cannot be reached (%s: %s); requests that need "
                    "it get 503 and /readyz is not ready until it answers",
                    type(exc).__name__, exc,
                )  # fmt: skip
            # Fail closed: without the shared counts no replica can know whether a key is over.
            raise ServiceUnavailable(
                "The gateway cannot reach its rate-limit store right now; retry in a few seconds.",
                code="rate_limit_store_unavailable",
            ) from exc
        if self._down_since is not None:
            log.warning(
                "the rate-limit store (Redis) answers again after %.1f s unreachable",
                time.monotonic() - self._down_since,
            )
            self._down_since = None


class RedisLimitStore:
    def __init__(self, url: str, *, key_prefix: str = "llmgw:ratelimit") -> None:
        self._client: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=2.0
        )
        self._hit: Any = self._client.register_script(_HIT)
        self._admit: Any = self._client.register_script(_ADMIT)
        self._settle: Any = self._client.register_script(_SETTLE)
        self._use: Any = self._client.register_script(_USE)
        self._renew: Any = self._client.register_script(_RENEW)
        self._cancel: Any = self._client.register_script(_CANCEL)
        self._usage: Any = self._client.register_script(_USAGE)
        self._key_prefix = key_prefix
        self._reachability = _Reachability()

    def _counter(self, name: str) -> str:
        return f"{self._key_prefix}:counter:{name}"

    def _cancel_mark(self, lease_id: uuid.UUID) -> str:
        return f"{self._key_prefix}:cancelled:{lease_id}"

    async def start(self) -> None:
        """Nothing to start: keys expire by themselves (EXPIRE), so there is no pruning."""

    async def close(self) -> None:
        await self._client.aclose()

    async def ping(self) -> None:
        with self._reachability.errors():
            await self._client.ping()

    async def hit(self, window: Window) -> RateLimitDecision:
        with self._reachability.errors():
            allowed, count, reset = await self._hit(
                keys=[f"{self._key_prefix}:{window.key_id}"], args=[window.limit, window.seconds]
            )
        return RateLimitDecision(
            allowed=bool(allowed),
            limit=window.limit,
            remaining=max(0, window.limit - int(count)),
            reset_seconds=float(reset),
        )

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        window = admission.window
        args: list[Any] = [
            "" if window is None else window.limit,
            0 if window is None else window.seconds,
            str(admission.lease_id),
            admission.lease_seconds,
            len(admission.reservations),
        ]
        for reservation in admission.reservations:
            args.extend((repr(reservation.cap), repr(reservation.amount), reservation.keep_seconds))
        keys = [
            "" if window is None else f"{self._key_prefix}:{window.key_id}",
            self._cancel_mark(admission.lease_id),
            *(self._counter(r.counter) for r in admission.reservations),
            *(self._counter(c.counter) for c in settling),
        ]
        args.extend(self._settle_args(settling))
        with self._reachability.errors():
            allowed, count, reset, refused, *totals = await self._admit(keys=keys, args=args)
        index = int(refused)
        if index < 0:
            return AdmissionResult(None, cancelled=True)
        decision = None
        if window is not None:
            decision = RateLimitDecision(
                allowed=bool(allowed),
                limit=window.limit,
                remaining=max(0, window.limit - int(count)),
                reset_seconds=float(reset),
            )
        if index > 0:
            return AdmissionResult(decision, admission.reservations[index - 1])
        return AdmissionResult(decision, taken=tuple(float(t) for t in (totals or [[]])[0]))

    @staticmethod
    def _settle_args(charges: Sequence[Charge]) -> list[str]:
        return [arg for c in charges for arg in (str(c.lease_id), repr(c.actual))]

    async def settle(self, charges: Sequence[Charge]) -> None:
        with self._reachability.errors():
            await self._settle(
                keys=[self._counter(c.counter) for c in charges], args=self._settle_args(charges)
            )

    async def use(self, charges: Sequence[Charge]) -> None:
        with self._reachability.errors():
            await self._use(
                keys=[self._counter(c.counter) for c in charges], args=self._settle_args(charges)
            )

    async def renew(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        keys: list[str] = []
        args: list[Any] = [seconds]
        for lease_id, counters in leases:
            for counter in counters:
                keys.append(self._counter(counter))
                args.append(str(lease_id))
        if keys:
            with self._reachability.errors():
                await self._renew(keys=keys, args=args)

    async def cancel(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        marks = [self._cancel_mark(lease_id) for lease_id, _ in leases]
        counters: list[str] = []
        args: list[Any] = [seconds, len(marks)]
        for lease_id, names in leases:
            for name in names:
                counters.append(self._counter(name))
                args.append(str(lease_id))
        if marks:
            with self._reachability.errors():
                await self._cancel(keys=[*marks, *counters], args=args)

    async def usage(self, counter: str) -> tuple[float, float]:
        with self._reachability.errors():
            used, reserved = await self._usage(keys=[self._counter(counter)], args=[])
        return float(used), float(reserved)
