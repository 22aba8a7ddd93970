"""A shared total read from the database at most once per TTL, plus what this replica added since.

Budgets and token limits both need "how much has been used" on every request without a query per
request. Each replica re-reads the shared total (written by the usage ledger) at most once per
``ttl`` and adds its own usage immediately, so the only usage it cannot see yet is other replicas'
usage of the last ``ttl`` + ledger flush interval.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import attrs

__all__ = ["AllowanceCache"]

K = TypeVar("K", bound=Hashable)


@attrs.define(slots=True)
class _Entry:
    used: float
    fetched_at: float


class AllowanceCache(Generic[K]):
    def __init__(
        self,
        fetch_used: Callable[[K], Awaitable[float]],
        *,
        ttl: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        self._fetch_used = fetch_used
        self._ttl = ttl
        self._clock = clock
        self._max_entries = max_entries
        self._entries: dict[K, _Entry] = {}

    async def current(self, key: K) -> float:
        now = self._clock()
        entry = self._entries.get(key)
        if entry is None or now - entry.fetched_at >= self._ttl:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()  # windows roll over; stale keys are never read again
            entry = _Entry(await self._fetch_used(key), now)
            self._entries[key] = entry
        return entry.used

    def add(self, key: K, amount: float) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.used += amount
