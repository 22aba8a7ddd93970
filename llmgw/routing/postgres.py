"""Health changes through Postgres: NOTIFY on one channel, LISTENed to by every replica.

One connection of its own does both (as the auth cache's revocations do): nothing is stored, so a
replica that starts learns of a deployment that is down from the next change, or finds it itself.
While the connection is down changes are neither sent nor received; it is opened again every
half second and the outage is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from llmgw.background import cancel_and_wait
from llmgw.routing.channel import CHANNEL, HealthChange, Receiver, decode, encode
from llmgw.storage.database import DATABASE_DOWN_ERRORS, DATABASE_TIMEOUT_SECONDS

__all__ = ["PostgresHealthChannel"]

log = logging.getLogger(__name__)


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

    async def publish(self, change: HealthChange) -> None:
        connection = self._connection
        if connection is None or connection.is_closed():
            raise ConnectionError("the deployment health connection is down")
        await connection.execute(
            "SELECT pg_notify($1, $2)", CHANNEL, encode(change), timeout=self._timeout
        )

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        if self._connection is not None and not self._connection.is_closed():
            try:
                await self._connection.close(timeout=self._timeout)
            except DATABASE_DOWN_ERRORS:
                self._connection.terminate()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        change = decode(payload)
        if change is not None and self._receive is not None:
            self._receive(change)

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
        except BaseException:
            connection.terminate()
            raise
        return connection
