"""Where entries live: one small protocol, a memory backend (one process, least recently used
evicted first within ``CACHE_MAX_BYTES``) and Redis (``llmgw.cache.redis``, shared by replicas).

A store is given an entry with its encoded form and gives entries back: Redis keeps the encoded
bytes and decodes them on a read, the memory backend keeps the entry itself (counted at its
encoded size), so a hit in memory decodes nothing.

A store shared by processes also carries each fetch in flight across them (claims, and the
events of a streamed answer relayed while it is fetched: ``llmgw.cache.redis``); in one process
the flights (``llmgw.cache.flight``) are every fetch there is, so the memory backend has no claims
(``shares_claims`` is False: it is never asked for one)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from llmgw.cache.entry import Entry
from llmgw.cache.key import CacheKey

__all__ = ["CacheStore", "CacheUnavailable", "Claim", "MemoryCacheStore", "Sighting"]


class CacheUnavailable(Exception):
    """The store did not answer in time: the request goes on without the cache."""


@attrs.frozen
class Claim:
    """A process's claim on fetching one key's answer (see :meth:`CacheStore.lead`)."""

    key: CacheKey
    token: str  # this claim's own: a late give-up never removes a later claim


@attrs.frozen
class Sighting:
    """What a process sees of another one fetching a key's answer (see :meth:`CacheStore.follow`)."""

    fetcher: str | None  # the token of the claim on it now (None: no one fetches it)
    entry: Entry | None = None  # the entry stored
    events: tuple[bytes, ...] = ()  # the followed fetch's events relayed after the cursor
    cursor: str = "0"  # where the next look at that relay starts
    # The relay's end, when the fetch completed its streamed answer: that answer less its events
    # (they are the events relayed).
    answer: Entry | None = None


class CacheStore(Protocol):
    # Whether its entries are shared by processes, each fetch claimed for all of them
    # (:meth:`lead`); a store that does not is never asked for a claim.
    shares_claims: bool

    async def get(self, key: CacheKey) -> Entry | None:
        """The entry stored under ``key`` (None: none, expired, or not readable as an entry)."""
        ...

    async def put(self, key: CacheKey, entry: Entry, value: bytes) -> None:
        """Store ``entry`` for its TTL; ``value`` is its encoded form (``encode_entry``)."""
        ...

    async def clear(self, *, key_id: str | None = None, model: str | None = None) -> int:
        """Delete every entry (stored by ``key_id``, for ``model``); the number deleted."""
        ...

    def bytes_held(self) -> int | None:
        """What the entries take, when the store knows it cheaply (None: it does not)."""
        ...

    async def lead(self, key: CacheKey) -> Claim | None:
        """Claim the fetching of ``key``'s answer for every process sharing the store (None:
        another one fetches it now). A claim lasts until :meth:`landed` (or, should its process
        die, a few seconds). Asked only of a store that ``shares_claims``."""
        ...

    async def relay(self, claim: Claim, events: Sequence[bytes]) -> None:
        """Append the next ``events`` of the streamed answer ``claim`` fetches, for the
        processes following it (:meth:`follow`); the caller writes one batch at a time."""
        ...

    async def landed(self, claim: Claim, relayed: Entry | None) -> None:
        """Give ``claim`` up (its answer stored, or not to be), which ends its relay: with
        ``relayed``, the streamed answer whose events were all relayed (its followers complete
        it with that), else without an answer."""
        ...

    async def follow(
        self, key: CacheKey, fetcher: str | None, cursor: str, wait: float
    ) -> Sighting:
        """What a request that another process fetches for can see: who fetches ``key``'s
        answer now, the entry stored, and (``fetcher``: the claim followed) the events that
        fetch relayed after ``cursor``, waiting up to ``wait`` seconds for the next."""
        ...

    async def open(self) -> None:
        """Be ready for the first request (a connection made at start, not in its time budget);
        :class:`CacheUnavailable` when the store cannot be reached now."""
        ...

    async def close(self) -> None: ...


@attrs.define
class _Held:
    entry: Entry
    size: int  # its encoded size
    expires_at: float
    key: CacheKey


class MemoryCacheStore:
    shares_claims = False

    def __init__(
        self,
        *,
        max_bytes: int,
        clock: Callable[[], float],
        on_evict: Callable[[int], None] = lambda _: None,
    ) -> None:
        self._entries: OrderedDict[str, _Held] = OrderedDict()
        self._max_bytes = max_bytes
        self._held = 0
        self._clock = clock
        self._on_evict = on_evict

    async def get(self, key: CacheKey) -> Entry | None:
        held = self._entries.get(key.digest)
        if held is None:
            return None
        if held.expires_at <= self._clock():
            self._drop(key.digest)
            return None
        self._entries.move_to_end(key.digest)
        return held.entry

    async def put(self, key: CacheKey, entry: Entry, value: bytes) -> None:
        size = len(value)
        if size > self._max_bytes:
            return
        if key.digest in self._entries:
            self._drop(key.digest)
        self._entries[key.digest] = _Held(entry, size, self._clock() + entry.ttl, key)
        self._held += size
        evicted = 0
        while self._held > self._max_bytes:
            self._drop(next(iter(self._entries)))
            evicted += 1
        if evicted:
            self._on_evict(evicted)

    async def clear(self, *, key_id: str | None = None, model: str | None = None) -> int:
        doomed = [
            digest
            for digest, held in self._entries.items()
            if (key_id is None or held.key.key_id == key_id)
            and (model is None or held.key.model == model)
        ]
        for digest in doomed:
            self._drop(digest)
        return len(doomed)

    def bytes_held(self) -> int:
        return self._held

    # One process: its own flights (llmgw.cache.flight) are every fetch there is, so it gives no
    # claims (shares_claims) and has none to relay or give up.
    async def lead(self, key: CacheKey) -> Claim | None:
        raise NotImplementedError("a store in one process has no claims (shares_claims)")

    async def relay(self, claim: Claim, events: Sequence[bytes]) -> None:
        return None

    async def landed(self, claim: Claim, relayed: Entry | None) -> None:
        return None

    async def follow(
        self, key: CacheKey, fetcher: str | None, cursor: str, wait: float
    ) -> Sighting:
        return Sighting(None, await self.get(key), cursor=cursor)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._entries.clear()
        self._held = 0

    def _drop(self, digest: str) -> None:
        self._held -= self._entries.pop(digest).size
