"""One upstream call for identical requests in flight.

The first request of a cache key that misses leads: it calls the provider and publishes what
it gets (or, when another replica sharing the store fetches the answer, what that replica relays
of it and its end: ``ResponseCache._watch``). Identical requests arriving meanwhile follow: a
streamed one receives the leader's events as they arrive, a JSON one the whole answer at the end.
When the leader's call fails (or its answer cannot be shared), each follower that has been sent
nothing yet calls on its own; one that has been sent part of it ends with a stream error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llmgw.cache.entry import Entry

__all__ = ["Flight", "FlightFailed", "Flights"]


class FlightFailed(Exception):
    """The leader's answer did not complete after some of it was sent to a follower."""


class Flight:
    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.entry: Entry | None = None
        self.ended = False
        self._changed = asyncio.Event()

    def publish(self, event: bytes) -> None:
        self.events.append(event)
        self._wake()

    def end(self, entry: Entry | None) -> None:
        if self.ended:
            return
        self.entry = entry
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def answer(self) -> Entry | None:
        """The whole answer, once the leader has it (None: follow no more, call on your own)."""
        while not self.ended:
            await self._changed.wait()
        return self.entry

    async def first_event(self) -> bool:
        """Wait for the first event or the end; False: the leader failed with nothing sent, and
        the follower calls on its own."""
        while not self.events and not self.ended:
            await self._changed.wait()
        return not self.ended or self.entry is not None

    async def stream(self) -> AsyncIterator[bytes]:
        """Every event, as it arrives; :class:`FlightFailed` if the answer does not complete."""
        sent = 0
        while True:
            while sent < len(self.events):
                yield self.events[sent]
                sent += 1
            if self.ended:
                if self.entry is None:
                    raise FlightFailed
                # What was not published, at once: all of a JSON leader's chunks (here or on
                # another replica), or the rest of another replica's stream whose relay broke.
                for event in self.entry.chunk_events()[sent:]:
                    yield event
                return
            await self._changed.wait()


class Flights:
    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}

    def join(self, digest: str) -> Flight | None:
        return self._flights.get(digest)

    def lead(self, digest: str) -> Flight:
        flight = self._flights[digest] = Flight()
        return flight

    def land(self, digest: str, flight: Flight, entry: Entry | None) -> None:
        if self._flights.get(digest) is flight:
            del self._flights[digest]
        flight.end(entry)

    def __len__(self) -> int:
        return len(self._flights)
