"""Health changes through Redis: PUBLISH on one channel, SUBSCRIBEd to by every replica.

Nothing is stored (as with Postgres): a replica that starts learns of a deployment that is down
from the next change, or finds it itself. A lost subscription is opened again every half second;
the outage is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.background import cancel_and_wait
from llmgw.routing.channel import CHANNEL, HealthChange, Receiver, decode, encode

__all__ = ["RedisHealthChannel"]

log = logging.getLogger(__name__)


class RedisHealthChannel:
    def __init__(self, url: str, *, channel: str = CHANNEL) -> None:
        # No socket timeout on reads: the subscription waits for messages as long as none come.
        self._client: aioredis.Redis = aioredis.from_url(url, socket_connect_timeout=2.0)
        self._channel = channel
        self._receive: Receiver | None = None
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def start(self, receive: Receiver) -> None:
        """Returns once subscribed, or after 2 s (it keeps trying in the background)."""
        self._receive = receive
        self._task = asyncio.create_task(self._listen_forever(), name="llmgw-health-subscribe")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), 2.0)

    async def publish(self, change: HealthChange) -> None:
        async with asyncio.timeout(2.0):
            await self._client.publish(self._channel, encode(change))

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        await self._client.aclose()

    async def _listen_forever(self) -> None:
        failing = False
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._subscribed.set()
                if failing:
                    log.warning("deployment health: Redis subscription open again")
                failing = False
                while True:
                    message: Any = await pubsub.get_message(timeout=None)
                    if message is not None and self._receive is not None:
                        change = decode(message["data"])
                        if change is not None:
                            self._receive(change)
            except (RedisError, OSError) as exc:
                self._subscribed.clear()
                if not failing:
                    log.warning(
                        "deployment health: Redis subscription lost (%s); retrying",
                        type(exc).__name__,
                    )
                failing = True
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(0.5)
