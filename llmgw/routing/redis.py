"""Health changes through Redis: PUBLISH on two channels (breakers, load), SUBSCRIBEd to by every
replica.

A breaker's newest change is also kept, as the message that announced it, under
``<channel>:open:<deployment>`` (the name older versions read) until :func:`kept_until` (``PX``),
by the script that publishes it: one written later by a replica whose write was late does not
replace a newer one. Each time the subscription opens the open breakers kept there are delivered,
so a replica that starts, or comes back from an outage, knows at once which deployments are down. A
lost subscription is opened again every half second; the outage is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.background import cancel_and_wait
from llmgw.routing.channel import (
    CHANNEL,
    LOAD_CHANNEL,
    HealthChange,
    Message,
    Receiver,
    decode,
    encode,
    kept_until,
)

__all__ = ["RedisHealthChannel"]

log = logging.getLogger(__name__)

# KEYS[1]: the deployment's key; ARGV: the change, its changed_at, how long to keep it (ms, none
# when <= 0), the channel. Newest wins as in Postgres: an equal changed_at replaces.
_KEEP_AND_PUBLISH = """
local kept = redis.call('GET', KEYS[1])
local newer = false
if kept then
    local ok, change = pcall(cjson.decode, kept)
    newer = ok and type(change) == 'table' and type(change.changed_at) == 'number'
        and change.changed_at > tonumber(ARGV[2])
end
if not newer and tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
end
return redis.call('PUBLISH', ARGV[4], ARGV[1])
"""


class RedisHealthChannel:
    def __init__(
        self, url: str, *, channel: str = CHANNEL, clock: Callable[[], float] = time.time
    ) -> None:
        # No socket timeout on reads: the subscription waits for messages as long as none come.
        self._client: aioredis.Redis = aioredis.from_url(url, socket_connect_timeout=2.0)
        self._channel = channel
        # The default names stay the Postgres ones; a test's own channel gets its own load channel.
        self._load_channel = LOAD_CHANNEL if channel == CHANNEL else f"{channel}:load"
        self._clock = clock  # how long a change is kept, and whether a kept one is still open
        self._keep_and_publish: Any = self._client.register_script(_KEEP_AND_PUBLISH)
        self._receive: Receiver | None = None
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def start(self, receive: Receiver) -> None:
        """Returns once subscribed, or after 2 s (it keeps trying in the background)."""
        self._receive = receive
        self._task = asyncio.create_task(self._listen_forever(), name="llmgw-health-subscribe")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), 2.0)

    async def publish(self, message: Message) -> None:
        payload = encode(message)
        async with asyncio.timeout(2.0):
            if not isinstance(message, HealthChange):
                await self._client.publish(self._load_channel, payload)
                return
            keep_ms = math.ceil((kept_until(message) - self._clock()) * 1000)
            await self._keep_and_publish(
                keys=[f"{self._channel}:open:{message.deployment}"],
                args=[payload, repr(message.changed_at), keep_ms, self._channel],
            )

    async def _deliver_open(self) -> None:
        """Every breaker kept open, to the receiver (after SUBSCRIBE: none is missed)."""
        assert self._receive is not None
        keys = [key async for key in self._client.scan_iter(match=f"{self._channel}:open:*")]
        now = self._clock()
        for payload in await self._client.mget(keys) if keys else []:
            change = None if payload is None else decode(payload)
            if isinstance(change, HealthChange) and (change.open_until or 0.0) > now:
                self._receive(change)

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        await self._client.aclose()

    async def _listen_forever(self) -> None:
        failing = False
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel, self._load_channel)
                await self._deliver_open()
                self._subscribed.set()
                if failing:
                    log.warning("deployment health: Redis subscription open again")
                failing = False
                while True:
                    message: Any = await pubsub.get_message(timeout=None)
                    if message is not None and self._receive is not None:
                        decoded = decode(message["data"])
                        if decoded is not None:
                            self._receive(decoded)
            except (RedisError, OSError) as exc:
                self._subscribed.clear()
                if not failing:
                    log.warning(
                        "deployment health: Redis subscription lost (%s); retrying",
                        type(exc).__name__,
                    )
                failing = True
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2
            await asyncio.sleep(0.5)
