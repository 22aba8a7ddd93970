"""Health changes within one process: one replica, and tests (several policies on one hub stand
for several replicas on one store)."""

from __future__ import annotations

import asyncio

from llmgw.routing.channel import HealthChange, Message, Receiver

__all__ = ["MemoryHealthChannel", "MemoryHealthHub"]


class MemoryHealthHub:
    """What a Postgres or a Redis server is to replicas: every message reaches every channel, and
    the open breakers are kept for a channel that starts."""

    def __init__(self) -> None:
        self.receivers: list[Receiver] = []
        self.open: dict[str, HealthChange] = {}  # deployment -> its newest change, while open


class MemoryHealthChannel:
    def __init__(self, hub: MemoryHealthHub | None = None) -> None:
        self._hub = hub or MemoryHealthHub()
        self._receive: Receiver | None = None

    async def start(self, receive: Receiver) -> None:
        self._receive = receive
        for change in self._hub.open.values():
            receive(change)
        self._hub.receivers.append(receive)

    async def publish(self, message: Message) -> None:
        if isinstance(message, HealthChange):
            kept = self._hub.open.get(message.deployment)
            if kept is None or kept.changed_at <= message.changed_at:
                self._hub.open.pop(message.deployment, None)
                if message.open_until is not None:
                    self._hub.open[message.deployment] = message
        loop = asyncio.get_running_loop()
        for receive in self._hub.receivers:
            loop.call_soon(receive, message)  # later, as a message from a server would arrive

    async def close(self) -> None:
        if self._receive in self._hub.receivers:
            self._hub.receivers.remove(self._receive)
