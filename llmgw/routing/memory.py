"""Health changes within one process: one replica, and tests (several policies on one hub stand
for several replicas on one store)."""

from __future__ import annotations

import asyncio

from llmgw.routing.channel import HealthChange, Receiver

__all__ = ["MemoryHealthChannel", "MemoryHealthHub"]


class MemoryHealthHub:
    """What a Postgres or a Redis server is to replicas: every change reaches every channel."""

    def __init__(self) -> None:
        self.receivers: list[Receiver] = []


class MemoryHealthChannel:
    def __init__(self, hub: MemoryHealthHub | None = None) -> None:
        self._hub = hub or MemoryHealthHub()
        self._receive: Receiver | None = None

    async def start(self, receive: Receiver) -> None:
        self._receive = receive
        self._hub.receivers.append(receive)

    async def publish(self, change: HealthChange) -> None:
        loop = asyncio.get_running_loop()
        for receive in self._hub.receivers:
            loop.call_soon(receive, change)  # later, as a message from a server would arrive

    async def close(self) -> None:
        if self._receive in self._hub.receivers:
            self._hub.receivers.remove(self._receive)
