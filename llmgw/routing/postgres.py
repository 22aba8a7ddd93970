"""Health changes through Postgres: NOTIFY on two channels (breakers, load), LISTENed to by every
replica.

One connection of its own does both (as the auth cache's revocations do). A breaker's change is
also kept in ``deployment_health`` (the newest per deployment, in the statement that notifies), and
the breakers open there are delivered each time the connection opens: a replica that starts, or
comes back from an outage, knows at once which deployments are down. While the connection is down
messages are neither sent nor received; it is opened again every half second and the outage is
logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from llmgw.background import cancel_and_wait
from llmgw.routing.channel import (
    CHANNEL,
    KEEP_SECONDS,
    LOAD_CHANNEL,
    HealthChange,
    Message,
    Receiver,
    decode,
    encode,
)
from llmgw.storage.database import DATABASE_DOWN_ERRORS, DATABASE_TIMEOUT_SECONDS

__all__ = ["PostgresHealthChannel"]

log = logging.getLogger(__name__)

# Keeps the newest change per deployment (an older one arriving late is not kept) and notifies in
# the same statement; rows of other deployments kept past ``kept_until`` go on the way out.
_KEEP_AND_NOTIFY = """
WITH kept AS (
    INSERT INTO deployment_health AS h
        (deployment, open_until, openings, last_failure_at, changed_at)
    VALUES ($3, $4, $5, $6, $7)
    ON CONFLICT (deployment) DO UPDATE SET
        open_until = EXCLUDED.open_until,
        openings = EXCLUDED.openings,
        last_failure_at = EXCLUDED.last_failure_at,
        changed_at = EXCLUDED.changed_at
    WHERE h.changed_at <= EXCLUDED.changed_at
), pruned AS (
    DELETE FROM deployment_health
    WHERE deployment <> $3
      AND coalesce(open_until, changed_at) + $8 < extract(epoch FROM clock_timestamp())
)
SELECT pg_notify($1, $2)
"""
_OPEN = """
SELECT deployment, open_until, openings, last_failure_at, changed_at FROM deployment_health
WHERE open_until > extract(epoch FROM clock_timestamp())
"""


class PostgresHealthChannel:
    def __init__(self, database_url: str, *, timeout: float = DATABASE_TIMEOUT_SECONDS) -> None:
        self._url = database_url
        self._timeout = timeout
        self._connection: asyncpg.Connection | None = None
        self._receive: Receiver | None = None
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    async def start(self, receive: Receiver) -> None:
        """Returns once listening, or after ``timeout`` (it keeps trying in the background)."""
        self._receive = receive
        self._task = asyncio.create_task(self._listen_forever(), name="llmgw-health-listen")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), self._timeout)

    async def publish(self, message: Message) -> None:
        connection = self._connection
        if connection is None or connection.is_closed():
            raise ConnectionError("the deployment health connection is down")
        if isinstance(message, HealthChange):
            await connection.execute(
                _KEEP_AND_NOTIFY,
                CHANNEL,
                encode(message),
                message.deployment,
                message.open_until,
                message.openings,
                message.last_failure_at,
                message.changed_at,
                KEEP_SECONDS,
                timeout=self._timeout,
            )
        else:
            await connection.execute(
                "SELECT pg_notify($1, $2)", LOAD_CHANNEL, encode(message), timeout=self._timeout
            )

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        if self._connection is not None and not self._connection.is_closed():
            try:
                await self._connection.close(timeout=self._timeout)
            except DATABASE_DOWN_ERRORS:
                self._connection.terminate()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        message = decode(payload)
        if message is not None and self._receive is not None:
            self._receive(message)

    async def _listen_forever(self) -> None:
        failing = False
        while True:
            if self._connection is None or self._connection.is_closed():
                self._connected.clear()
                try:
                    self._connection = await self._connect()
                except DATABASE_DOWN_ERRORS as exc:
                    if not failing:
                        log.warning(
                            "deployment health: LISTEN connection failed (%s); retrying",
                            type(exc).__name__,
                        )
                    failing = True
                else:
                    if failing:
                        log.warning("deployment health: LISTEN connection open again")
                    failing = False
                    self._connected.set()
            await asyncio.sleep(0.5)

    async def _connect(self) -> asyncpg.Connection:
        connection: asyncpg.Connection = await asyncpg.connect(self._url, timeout=self._timeout)
        try:
            async with asyncio.timeout(self._timeout):
                await connection.add_listener(CHANNEL, self._on_notify)
                await connection.add_listener(LOAD_CHANNEL, self._on_notify)
                # After LISTEN: a change made meanwhile arrives as well (taken if newer).
                rows = await self._open_breakers(connection)
        except BaseException:
            connection.terminate()
            raise
        if self._receive is not None:
            for row in rows:
                self._receive(HealthChange(**dict(row)))
        return connection

    async def _open_breakers(self, connection: asyncpg.Connection) -> list[asyncpg.Record]:
        """The breakers kept open; none while the schema is behind (/readyz says so, and the
        replica still serves: it only learns of breakers as they change)."""
        try:
            rows: list[asyncpg.Record] = await connection.fetch(_OPEN)
        except asyncpg.UndefinedTableError:
            log.warning(
                "deployment health: no deployment_health table (the schema is behind: "
                "llmgw db upgrade); breakers kept open by other replicas are not loaded"
            )
            return []
        return rows
