"""Health changes within one process: one replica, and tests (several policies on one hub stand
for several replicas on one store)."""

from __future__ import annotations

import asyncio

from llmgw.routing.channel import HealthChange, Message, Receiver

__all__ = ["MemoryHealthChannel", "MemoryHealthHub"]


class MemoryHealthHub:
    """What a Postgres or a Redis server is to replicas: every message reaches every channel, and
    the newest change per deployment is kept (the open ones are told to a channel that starts)."""

    def __init__(self) -> None:
        self.receivers: list[Receiver] = []
        # deployment -> its newest change, closed ones too (a late older one is not kept); as many
        # as deployments, so nothing is forgotten
        self.kept: dict[str, HealthChange] = {}


class MemoryHealthChannel:
    def __init__(self, hub: MemoryHealthHub | None = None) -> None:
        self._hub = hub or MemoryHealthHub()
        self._receive: Receiver | None = None

    async def start(self, receive: Receiver) -> None:
        self._receive = receive
        for change in self._hub.kept.values():
            if change.open_until is not None:
                receive(change)
        self._hub.receivers.append(receive)

    async def publish(self, message: Message) -> None:
        if isinstance(message, HealthChange):
            kept = self._hub.kept.get(message.deployment)
            if kept is None or kept.changed_at <= message.changed_at:
                self._hub.kept[message.deployment] = message
        loop = asyncio.get_running_loop()
        for receive in self._hub.receivers:
            loop.call_soon(receive, message)  # later, as a message from a server would arrive

    async def close(self) -> None:
        if self._receive in self._hub.receivers:
            self._hub.receivers.remove(self._receive)
