"""The cache as the request path sees it: look a request up, follow or lead its flight, store a
complete answer, clear entries. The store is injected (memory or Redis), and so is the clock.

A flight led here whose fetch another process follows (a shared claim: Redis) relays its streamed
events through the store as they come, in the background, never in the way of the leader's own
stream; a flight another process fetches is followed through the store (``ResponseCache._watch``),
its relayed events published to this process's followers as they arrive."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
from opentelemetry import metrics

from llmgw.accounting.usage import Usage
from llmgw.cache.controls import Controls
from llmgw.cache.entry import Entry, Form, encode_entry
from llmgw.cache.flight import Flight, Flights
from llmgw.cache.key import (
    NATIVE_MESSAGES,
    NATIVE_RESPONSES,
    CacheKey,
    cache_key,
    cacheable,
    scope_of,
)
from llmgw.cache.responses import response_completed
from llmgw.cache.store import CacheStore, CacheUnavailable, Claim, Sighting
from llmgw.config.providers_file import ModelAlias
from llmgw.telemetry import semconv as sc

__all__ = [
    "BYPASS",
    "CACHE_HEADER",
    "HIT",
    "MISS",
    "AliasCache",
    "Lookup",
    "ResponseCache",
    "alias_caches",
]

log = logging.getLogger(__name__)

HIT, MISS, BYPASS = "hit", "miss", "bypass"
CACHE_HEADER = "X-LLMGW-Cache"

# The form each API's answers are kept in (Entry.form): chat's, but for a provider's own API.
_API_FORMS: dict[str, Form] = {NATIVE_MESSAGES: "messages", NATIVE_RESPONSES: "responses"}


class _Counter(Protocol):
    def add(self, amount: float, attributes: Mapping[str, str] | None = None, /) -> None: ...


class CounterMeter(Protocol):
    """What makes the cache's counters: the gateway's LocalMeter (a point costs about 1 µs, on
    every request), or any OpenTelemetry meter."""

    def create_counter(self, name: str, *, unit: str = "", description: str = "") -> Any: ...


@attrs.frozen
class AliasCache:
    """An alias's own say (``cache = false``, ``cache_ttl_seconds``) in the providers file."""

    enabled: bool = True
    ttl_seconds: float | None = None


def alias_caches(aliases: Iterable[ModelAlias]) -> dict[str, AliasCache]:
    """What each alias of the configuration says of the cache, by its name."""
    return {alias.alias: AliasCache(alias.cache, alias.cache_ttl_seconds) for alias in aliases}


class _Relay:
    """A leader's streamed events on their way to its followers in other processes: what one
    loop tick adds is one write, made in the background, one write at a time so they stay in
    order. The first write that fails ends the relay (a follower never sees a gap: it takes the
    stored entry, or ends as when the leader fails)."""

    def __init__(
        self,
        store: CacheStore,
        claim: Claim,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        unavailable: Callable[[CacheUnavailable], None],
    ) -> None:
        self._store = store
        self._claim = claim
        self._spawn = spawn
        self._unavailable = unavailable
        self._pending: list[bytes] = []
        self._writing: asyncio.Task[None] | None = None
        self.whole = True  # every event added is written, or to be

    def add(self, event: bytes) -> None:
        if not self.whole:
            return
        self._pending.append(event)
        if self._writing is None:
            self._writing = self._spawn(self._write())

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._store.relay(self._claim, batch)
        except CacheUnavailable as error:
            self._broken()
            self._unavailable(error)
        except Exception:
            self._broken()
            log.exception("the response cache could not relay a streamed answer")
        finally:
            self._writing = None

    def _broken(self) -> None:
        self.whole = False
        self._pending = []

    async def written(self) -> bool:
        """Once the writes under way are done: whether every event added was written."""
        if self._writing is not None:
            await asyncio.wait([self._writing])
        return self.whole


@attrs.define(eq=False)
class Lookup:
    """What the cache had for one request, and (a miss) the recording of its answer."""

    result: str  # hit | miss | bypass
    key: CacheKey | None = None
    entry: Entry | None = None  # a hit's answer
    age: float = 0.0
    follows: Flight | None = None  # a follower: the leader's flight
    leads: Flight | None = None  # the leader: the flight it publishes to
    claim: Claim | None = None  # the leader's claim on fetching the answer, for every replica
    relay: _Relay | None = None  # the leader's, when other replicas follow its claim
    ttl: float = 0.0  # 0: the answer is not stored
    form: Form = "chat"  # the API the answer is in (see Entry.form)
    # The streamed answer's events, held while it lasts (its size is checked when it is stored).
    events: list[bytes] = attrs.Factory(list)
    complete: bool = False
    spoiled: bool = False

    # The relay's tap (llmgw.streaming.relay.StreamTap) on a streamed answer.
    def event(self, event: bytes) -> None:
        if self.spoiled:
            return
        self.events.append(event)
        if self.leads is not None:
            self.leads.publish(event)
        if self.relay is not None:
            self.relay.add(event)

    def broken(self) -> None:
        """The answer was spliced or cut: not one stream that can be stored or replayed."""
        self.spoiled = True

    def completed(self) -> None:
        self.complete = True


# How long this replica's requests wait for another replica's answer at most, and how long each
# look at it waits for its next relayed event or its end (how soon a fetch whose replica went
# away, or one that ends without saying so, is seen over).
FOLLOW_SECONDS = 900.0
_LOOK_SECONDS = 0.25

_BYPASS = Lookup(BYPASS)
_NO_ALIAS = AliasCache()
# A lookup's counter point's attributes, made once (one per result).
_RESULT_ATTRIBUTES = {result: {sc.LLMGW_CACHE_RESULT: result} for result in (HIT, MISS, BYPASS)}


class ResponseCache:
    def __init__(
        self,
        store: CacheStore,
        *,
        ttl_seconds: float,
        max_entry_bytes: int,
        scope: str = "key",
        clock: Callable[[], float],
        aliases: Mapping[str, AliasCache] | None = None,
        meter: CounterMeter | None = None,
        gauges: metrics.Meter | None = None,
    ) -> None:
        self.store = store
        self._ttl = ttl_seconds
        self._max_entry_bytes = max_entry_bytes
        self._scope = scope
        self._clock = clock
        self._aliases = dict(aliases or {})
        self.flights = Flights()
        self._down = False
        self._writes: set[asyncio.Task[None]] = set()
        self._watches: set[asyncio.Task[None]] = set()  # other replicas' fetches followed
        self._landing: dict[str, asyncio.Task[None]] = {}  # by digest: claims being given up
        gauges = gauges or metrics.get_meter("llmgw.cache")
        meter = meter or gauges
        self._lookups: _Counter = meter.create_counter(
            sc.METRIC_CACHE_LOOKUPS, unit="{request}", description="Cache lookups, by result"
        )
        self.evictions: _Counter = meter.create_counter(
            sc.METRIC_CACHE_EVICTIONS,
            unit="{entry}",
            description="Entries evicted to stay within CACHE_MAX_BYTES",
        )
        gauges.create_observable_gauge(
            sc.METRIC_CACHE_BYTES,
            callbacks=[self._observe_bytes],
            unit="By",
            description="Bytes the memory cache holds",
        )

    def _observe_bytes(self, _options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        held = self.store.bytes_held()
        return [] if held is None else [metrics.Observation(held)]

    def reconfigure(self, aliases: Mapping[str, AliasCache]) -> None:
        """A reloaded configuration's aliases (SIGHUP): what they say applies from the next
        lookup; entries already stored keep the TTL they were stored with."""
        self._aliases = dict(aliases)

    def counted(self, result: str) -> None:
        self._lookups.add(1, _RESULT_ATTRIBUTES[result])

    async def lookup(
        self,
        *,
        api: str,
        model: str,
        body: dict[str, Any],
        key_id: str,
        subject_id: str | None,
        controls: Controls,
        team_id: str | None = None,
    ) -> Lookup:
        """Read the cache for a request (counted by result); a miss leads its flight, which
        the caller must end with :meth:`settle` or :meth:`abandon`."""
        try:
            scope = scope_of(self._scope, key_id, subject_id, team_id)
            lookup = await self._lookup(api, model, body, key_id, scope, controls)
        except Exception:
            # The cache's own failure never fails a request: it goes to the provider.
            log.exception("the response cache could not look a request up; bypassed")
            lookup = _BYPASS
        self.counted(lookup.result)
        return lookup

    async def _lookup(
        self,
        api: str,
        model: str,
        body: dict[str, Any],
        key_id: str,
        scope: str,
        controls: Controls,
    ) -> Lookup:
        alias = self._aliases.get(model, _NO_ALIAS)
        if not alias.enabled or not cacheable(api, body) or not controls.write:
            return _BYPASS
        ttl = alias.ttl_seconds or self._ttl
        if controls.ttl is not None:
            ttl = min(ttl, controls.ttl)
        key = cache_key(api, model, scope, body, key_id)
        if not controls.read:
            # no-cache: not read, the fresh answer stored
            return Lookup(BYPASS, key, ttl=ttl, form=_API_FORMS.get(api, "chat"))
        flight = self.flights.join(key.digest)
        if flight is not None:
            return Lookup(HIT, key, follows=flight)
        try:
            entry = await self.store.get(key)
        except CacheUnavailable as error:
            self._unavailable(error)
            return _BYPASS
        self._available()
        now = self._clock()
        if (
            entry is not None
            and entry.fresh(now)
            and (controls.max_age is None or entry.age(now) <= controls.max_age)
        ):
            return Lookup(HIT, key, entry=entry, age=entry.age(now))
        flight = self.flights.join(key.digest)  # one may have taken off while the store answered
        if flight is not None:
            return Lookup(HIT, key, follows=flight)
        # Led here before the store is asked who fetches: identical requests arriving meanwhile
        # follow this flight, whoever turns out to fetch its answer.
        flight = self.flights.lead(key.digest)
        miss = Lookup(MISS, key, leads=flight, ttl=ttl, form=_API_FORMS.get(api, "chat"))
        if not self.store.shares_claims:
            return miss  # this process's flights are every fetch there is: nothing to claim
        claim: Claim | None = None
        try:
            landing = self._landing.get(key.digest)
            if landing is not None:
                # This replica's last claim on it is still being given up: not someone else's.
                await asyncio.wait([landing])
            claim = await self.store.lead(key)
            fetched_elsewhere = claim is None
        except CacheUnavailable as error:
            self._unavailable(error)
            fetched_elsewhere = False  # no one can be told: fetched here, as without the cache
        except BaseException:
            self.flights.land(key.digest, flight, None)
            raise
        if fetched_elsewhere:
            # Another replica fetches it: this replica's requests follow it through the store.
            # Only an entry stored after the one found here answers it: that one was too old.
            older = -math.inf if entry is None else entry.stored_at
            self._spawn(self._watches, self._watch(key, flight, older))
            return Lookup(HIT, key, follows=flight)
        if claim is not None:  # other processes follow it: its streamed events are relayed
            miss.claim = claim
            miss.relay = _Relay(
                self.store, claim, functools.partial(self._spawn, self._writes), self._unavailable
            )
        return miss

    async def _watch(self, key: CacheKey, flight: Flight, older: float) -> None:
        """Follow another replica's fetching of ``key``'s answer: its relayed events are
        published to this replica's flight as they arrive, and its end (the relay's, or its
        stored entry) ends the flight; a fetch that ends without one (failed, not storable, its
        replica gone: the claim expired) sends each follower that was sent nothing to the
        provider on its own."""
        entry: Entry | None = None
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + FOLLOW_SECONDS
        fetcher: str | None = None
        cursor, wait = "0", 0.0
        try:
            while loop.time() < give_up_at:
                seen = await self.store.follow(key, fetcher, cursor, wait)
                for event in seen.events:
                    flight.publish(event)
                cursor = seen.cursor
                entry = self._answer_seen(seen, flight.events, older)
                if entry is not None or seen.fetcher is None or fetcher not in (None, seen.fetcher):
                    break  # answered, or the fetch followed is over without an answer
                fetcher, wait = seen.fetcher, _LOOK_SECONDS
        except CacheUnavailable as error:
            self._unavailable(error)
        except Exception:
            log.exception("the response cache could not follow another replica's answer")
        finally:
            self.flights.land(key.digest, flight, entry)

    def _answer_seen(self, seen: Sighting, relayed: Sequence[bytes], older: float) -> Entry | None:
        """The answer a look at another replica's fetch finds: the end of its relay, or an entry
        stored that goes on from what was relayed (one whose events differ would splice two
        answers)."""
        if seen.answer is not None:
            return attrs.evolve(seen.answer, events=tuple(relayed))
        found = seen.entry
        if found is None or found.stored_at <= older or not found.fresh(self._clock()):
            return None
        if relayed and found.chunk_events()[: len(relayed)] != tuple(relayed):
            return None
        return found

    def settle(
        self,
        lookup: Lookup,
        *,
        usage: Usage | None,
        body: bytes | None = None,
        response_model: str | None = None,
    ) -> asyncio.Future[None] | None:
        """A complete answer (``body``: JSON; else the stream the lookup recorded): shared with
        the followers at once, and stored (in the background: the returned future) when it may
        be. An answer whose usage is unknown is not shared or stored."""
        stream = body is None
        if (
            lookup.key is None
            or usage is None
            or (usage.input_tokens is None and usage.output_tokens is None)
            or (stream and (not lookup.complete or lookup.spoiled or not lookup.events))
        ):
            self.abandon(lookup)
            return None
        # A Responses stream ends as whole on response.incomplete: the followers, who were sent
        # it as it came, get its end, but it is not kept.
        kept = not stream or lookup.form != "responses" or response_completed(lookup.events)
        entry = Entry(
            stored_at=self._clock(),
            ttl=lookup.ttl,
            usage=usage,
            body=body,
            events=tuple(lookup.events) if stream else None,
            response_model=response_model,
            form=lookup.form,
        )
        if lookup.leads is not None:
            self.flights.land(lookup.key.digest, lookup.leads, entry)
            lookup.leads = None
        stored = entry if lookup.ttl > 0 and kept else None
        return self._put(lookup, stored, entry if stream else None)

    def abandon(self, lookup: Lookup) -> None:
        """The answer is not shared: each follower calls on its own. Idempotent."""
        if lookup.leads is not None and lookup.key is not None:
            self.flights.land(lookup.key.digest, lookup.leads, None)
            lookup.leads = None
        self._put(lookup, None, None)

    def _spawn(
        self, tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]
    ) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    def _put(
        self, lookup: Lookup, entry: Entry | None, answer: Entry | None
    ) -> asyncio.Task[None] | None:
        """Store ``entry`` (None: nothing) under the lookup's key, then give its claim up ending
        its relay (with ``answer``, the streamed answer, once all of it is relayed), in the
        background: in that order, so another replica following the claim finds the entry
        stored when it is over (if it could be stored). None: neither is to be done."""
        key = lookup.key
        claim, lookup.claim = lookup.claim, None
        relay, lookup.relay = lookup.relay, None
        if key is None or (entry is None and claim is None):
            return None
        task = self._spawn(self._writes, self._write(key, entry, claim, relay, answer))
        if claim is not None:
            self._landing[key.digest] = task
            task.add_done_callback(functools.partial(self._landed, key.digest))
        return task

    def _landed(self, digest: str, task: asyncio.Task[None]) -> None:
        if self._landing.get(digest) is task:
            del self._landing[digest]

    async def _write(
        self,
        key: CacheKey,
        entry: Entry | None,
        claim: Claim | None,
        relay: _Relay | None,
        answer: Entry | None,
    ) -> None:
        try:
            if relay is None or not await relay.written():
                answer = None  # its followers elsewhere lack part of it: the entry, or nothing
            try:
                if entry is not None and (value := self._storable(entry)) is not None:
                    await self.store.put(key, entry, value)
            finally:
                # Given up even when the entry was not stored: the other replicas' followers
                # need not wait for the claim to expire, and the relay's end completes them.
                if claim is not None:
                    await self.store.landed(claim, answer)
        except CacheUnavailable as error:
            self._unavailable(error)
        else:
            self._available()

    def _storable(self, entry: Entry) -> bytes | None:
        """The entry encoded, if it may be stored (None: too large, or not replayable)."""
        try:
            value = encode_entry(entry)
        except UnicodeDecodeError:
            return None  # bytes that are not text: not replayable as JSON or SSE
        return value if len(value) <= self._max_entry_bytes else None

    async def clear(self, *, key_id: str | None = None, model: str | None = None) -> int:
        return await self.store.clear(key_id=key_id, model=model)

    async def drained(self) -> None:
        """Every write under way has landed (shutdown, tests)."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def open(self) -> None:
        """Ready the store at start; one that cannot be reached yet is one warning, and
        requests bypass the cache until it can."""
        try:
            await self.store.open()
        except CacheUnavailable as error:
            self._unavailable(error)

    async def close(self) -> None:
        for watching in list(self._watches):
            watching.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)
        await self.drained()
        await self.store.close()

    def _unavailable(self, error: CacheUnavailable) -> None:
        if not self._down:
            self._down = True
            log.warning("the response cache is unreachable; requests bypass it (%s)", error)

    def _available(self) -> None:
        if self._down:
            self._down = False
            log.info("the response cache is reachable again")
