"""Limits in Postgres: one statement per request, exact under concurrency, on the database clock.

A plain request window (keys with no reservable limit) is today's single ``INSERT … ON CONFLICT DO
UPDATE … WHERE request_count < limit``: the row lock serialises concurrent requests on any number
of replicas, so exactly ``limit`` of them see a row come back. A request with reservations calls
``llmgw_limits_settle_then_admit`` (migrations 0014 and 0017), which does the window hit and every
reservation all or nothing in the same single statement, refuses a lease that
``llmgw_limits_cancel`` (migration 0010) cancelled first, and first settles the batch of
settlements that rides along (so a busy replica's settlements cost no transaction of their own);
``llmgw_limits_settle`` settles a batch by itself (an idle replica's); ``llmgw_limits_use``
(migration 0016) charges part of a live lease (a capacity lease's window slice, as it is used).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from llmgw.background import cancel_and_wait
from llmgw.limits.store import (
    Admission,
    AdmissionResult,
    Charge,
    RateLimitDecision,
    Reservation,
    Window,
)
from llmgw.storage.database import DATABASE_DOWN_ERRORS, database_errors
from llmgw.storage.hot_connections import HotConnections

__all__ = ["PostgresLimitStore"]

log = logging.getLogger(__name__)

_HIT = """
WITH clock AS (
    SELECT extract(epoch FROM clock_timestamp()) AS now_epoch
), window_bounds AS (
    SELECT to_timestamp(floor(now_epoch / $2::integer) * $2::integer) AS start_at,
           floor(now_epoch / $2::integer) * $2::integer + $2::integer - now_epoch AS reset_seconds
    FROM clock
), counted AS (
    INSERT INTO api_key_rate_limit_windows AS w
        (api_key_id, window_start_at, window_seconds, request_count)
    SELECT $1::uuid, start_at, $2::integer, 1 FROM window_bounds
    ON CONFLICT (api_key_id, window_start_at, window_seconds)
    DO UPDATE SET request_count = w.request_count + 1 WHERE w.request_count < $3::integer
    RETURNING request_count
)
SELECT (SELECT request_count FROM counted) AS request_count,
       (SELECT reset_seconds FROM window_bounds)::float8 AS reset_seconds
"""
_ADMIT = """
SELECT * FROM llmgw_limits_settle_then_admit(
    $1::uuid[], $2::text[], $3::float8[], $4, $5, $6, $7, $8, $9, $10, $11, $12)
"""
_SETTLE = "SELECT llmgw_limits_settle($1::uuid[], $2::text[], $3::float8[])"
_USE = "SELECT llmgw_limits_use($1::uuid[], $2::text[], $3::float8[])"
_CANCEL = "SELECT llmgw_limits_cancel($1::uuid[], $2::float8)"
_RENEW = """
UPDATE limit_leases SET expires_at = clock_timestamp() + make_interval(secs => $2)
WHERE lease_id = ANY($1::uuid[])
"""
_USAGE = """
SELECT c.used::float8 AS used,
       (c.reserved - coalesce((SELECT sum(amount) FROM limit_leases l
                               WHERE l.counter = c.counter AND l.expires_at < clock_timestamp()),
                              0))::float8 AS reserved
FROM limit_counters c WHERE c.counter = $1
"""
_PRUNE_WINDOWS = """
DELETE FROM api_key_rate_limit_windows
WHERE window_start_at + make_interval(secs => window_seconds) < now() - interval '1 minute'
"""
_PRUNE_CANCELLED = "DELETE FROM limit_cancelled_leases WHERE expires_at < now()"
_PRUNE_COUNTERS = """
DELETE FROM limit_counters c WHERE keep_until < now()
AND NOT EXISTS (SELECT 1 FROM limit_leases l WHERE l.counter = c.counter AND l.expires_at >= now())
"""


_CHARGE_FIELDS = operator.attrgetter("lease_id", "counter", "actual")
_RESERVATION_FIELDS = operator.attrgetter("counter", "cap", "amount", "keep_seconds")


def _arrays(
    rows: Sequence[Charge] | Sequence[Reservation], fields: operator.attrgetter[Any], width: int
) -> list[tuple[Any, ...]]:
    """The statement's arrays of ``rows``, one per field: read and transposed in C, not by a
    comprehension for each (every quiet key's admission sends seven)."""
    return list(zip(*map(fields, rows), strict=True)) or [()] * width


def _decision(limit: int, count: int | None, reset: float) -> RateLimitDecision:
    if count is None:
        return RateLimitDecision(allowed=False, limit=limit, remaining=0, reset_seconds=reset)
    return RateLimitDecision(
        allowed=True, limit=limit, remaining=max(0, limit - count), reset_seconds=reset
    )


class PostgresLimitStore:
    def __init__(
        self, pool: asyncpg.Pool, database_url: str, *, prune_interval: float = 60.0
    ) -> None:
        self._pool = pool
        # The hot statements run on connections of their own: a lean pool, and no wait for the WAL
        # flush. A counter lost in a database crash only forgives a little; latency is paid by all.
        self._connections = HotConnections(
            database_url, size=4, server_settings={"synchronous_commit": "off"}
        )
        self._prune_interval = prune_interval
        self._pruner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._pruner = asyncio.create_task(self._prune_forever(), name="llmgw-limits-prune")

    async def close(self) -> None:
        await cancel_and_wait([self._pruner])
        await self._connections.close()

    async def ping(self) -> None:
        """The database /readyz already checks: nothing more to ask."""

    async def hit(self, window: Window) -> RateLimitDecision:
        with database_errors():
            row = await self._connections.fetchrow(
                _HIT, window.key_id, window.seconds, window.limit
            )
        assert row is not None
        return _decision(window.limit, row["request_count"], row["reset_seconds"])

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> AdmissionResult:
        window = admission.window
        reservations = admission.reservations
        # Nothing to settle is sent as NULLs, not empty arrays: the function reads both alike
        # (``||`` and ``= ANY`` of a NULL array), and encoding an array, even an empty one, is
        # most of what sending an admission costs this process.
        settled = _arrays(settling, _CHARGE_FIELDS, 3) if settling else (None, None, None)
        with database_errors():
            row = await self._connections.fetchrow(
                _ADMIT,
                *settled,
                None if window is None else window.key_id,
                None if window is None else window.seconds,
                None if window is None else window.limit,
                admission.lease_id,
                admission.lease_seconds,
                *_arrays(reservations, _RESERVATION_FIELDS, 4),
            )
        assert row is not None
        decision = (
            None
            if window is None
            else _decision(window.limit, row["window_count"], row["window_reset"])
        )
        refused: int = row["refused"]
        if refused < 0:
            return AdmissionResult(None, cancelled=True)
        if refused > 0:
            return AdmissionResult(decision, reservations[refused - 1])
        return AdmissionResult(decision, taken=tuple(row["taken"] or ()))

    async def settle(self, charges: Sequence[Charge]) -> None:
        with database_errors():
            await self._connections.fetchrow(_SETTLE, *_arrays(charges, _CHARGE_FIELDS, 3))

    async def use(self, charges: Sequence[Charge]) -> None:
        with database_errors():
            await self._connections.fetchrow(_USE, *_arrays(charges, _CHARGE_FIELDS, 3))

    async def renew(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        with database_errors():
            await self._connections.fetchrow(_RENEW, [lease_id for lease_id, _ in leases], seconds)

    async def cancel(
        self, leases: Sequence[tuple[uuid.UUID, Sequence[str]]], seconds: float
    ) -> None:
        with database_errors():
            await self._connections.fetchrow(_CANCEL, [lease_id for lease_id, _ in leases], seconds)

    async def usage(self, counter: str) -> tuple[float, float]:
        with database_errors():
            row = await self._connections.fetchrow(_USAGE, counter)
        if row is None:
            return 0.0, 0.0
        return row["used"], max(0.0, row["reserved"])

    async def prune(self) -> int:
        """Delete ended windows, counters past their period and old cancellations; returns how
        many windows."""
        status: str = await self._pool.execute(_PRUNE_WINDOWS)
        await self._pool.execute(_PRUNE_COUNTERS)
        await self._pool.execute(_PRUNE_CANCELLED)
        return int(status.rsplit(" ", 1)[-1])

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(self._prune_interval)
            try:
                await self.prune()
            except DATABASE_DOWN_ERRORS as exc:
                log.warning("limit pruning skipped: %s", type(exc).__name__)
