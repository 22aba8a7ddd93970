"""Entries in Redis, shared by every replica: each under its own name with Redis's own expiry.

An entry's name carries the model it answered (clearing by model is a SCAN of a pattern), and
each key has a set of the names it stored (clearing by key reads that set); the key is not in the
name, since under a wider scope other keys read the same entry. A read or write that takes longer
than ``budget_seconds`` (or fails) raises :class:`CacheUnavailable`: the request goes on to the
provider.

A replica fetching an answer claims it for every replica (a name holding the claim's token,
expiring after ``claim_seconds`` unless renewed, so a replica that dies holds it only briefly);
the others' identical requests follow that fetch instead of calling the provider too. A streamed
answer's events are relayed while it is fetched, in a Redis stream of the claim's own (``XADD``,
expiring one claim's life after the claim, so it outlives every follower of it), which ends with
an ``end`` entry when the claim is given up: the answer less its events when its stream completed
and was relayed whole, else empty (a JSON answer relays only that end; its followers read the
stored entry). A follower reads the claim, the entry and (``XREAD BLOCK``: it waits a moment for
the next event or the end) that stream in one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence

import attrs
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llmgw.cache.entry import Entry, decode_entry, encode_entry
from llmgw.cache.key import CacheKey
from llmgw.cache.store import CacheUnavailable, Claim, Sighting

__all__ = ["RedisCacheStore"]

BUDGET_SECONDS = 0.05
CLAIM_SECONDS = 5.0
_OPEN_SECONDS = 2.0
# Connections to Redis at most, on every redis-py version (5.x sets no limit, newer ones 100,
# then fail every call): a burst of requests waits its turn, within its budget, for one. Of those,
# looks that wait for a relayed event (each holds its connection while it waits) take at most
# _WAITING_FOLLOWS; the other follows wait as long between looks holding none, then look without
# waiting (as many looks a second, each event seen up to one wait later).
_CONNECTIONS = 64
_WAITING_FOLLOWS = 16

# A claim (KEYS[1]) is renewed or given up only by its holder (its token): a renewal or give-up
# that came late must not prolong or delete a claim taken since. Its relay (KEYS[2]) lives on with
# it, and is ended whoever holds the claim now (it is this token's alone).
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('pexpire', KEYS[2], ARGV[3])"
    " return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
)
_GIVE_UP = (
    "redis.call('xadd', KEYS[2], '*', 'end', ARGV[2]) redis.call('pexpire', KEYS[2], ARGV[3])"
    " if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
_EVENT, _END = b"e", b"end"  # a relay's fields
# Redis ends a block that times out on its next tick (``hz``: 10 a second by default).
_BLOCK_LATENESS = 0.1


class RedisCacheStore:
    shares_claims = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "llmgw:cache",
        budget_seconds: float = BUDGET_SECONDS,
        claim_seconds: float = CLAIM_SECONDS,
    ) -> None:
        self._client: aioredis.Redis = aioredis.from_url(
            url,
            max_connections=_CONNECTIONS,
            socket_timeout=2.0,
            socket_connect_timeout=budget_seconds,
        )
        # Every call takes its turn here, within its own budget, so the pool is never asked for
        # more connections than it has (redis-py's own waiting pool holds a lock while it
        # connects, which a stalled Redis never gives back on some versions).
        self._turns = asyncio.Semaphore(_CONNECTIONS)
        self._prefix = prefix
        self._budget = budget_seconds
        # A look at a fetch followed is on no request's way to its answer (its followers wait
        # for that fetch anyway): it has longer before Redis counts as unavailable, so that a
        # replica busy with many followers does not take its own slowness for Redis's.
        self._look_budget = 10 * budget_seconds
        self._claim_ms = max(1, round(claim_seconds * 1000))
        self._relay_ms = 2 * self._claim_ms
        self._renew = self._client.register_script(_RENEW)
        self._give_up = self._client.register_script(_GIVE_UP)
        self._claims: dict[str, asyncio.Task[None]] = {}  # by token: each claim's renewal
        self._waiting_follows = 0

    @contextlib.asynccontextmanager
    async def _answering(self, seconds: float | None) -> AsyncIterator[None]:
        """Redis answers within ``seconds`` (``None``: however long it takes) on a connection of
        the store's, its turn for one included, or the block raises :class:`CacheUnavailable`
        (the request goes on without the cache)."""
        try:
            async with asyncio.timeout(seconds), self._turns:
                yield
        except (TimeoutError, RedisError, OSError) as error:
            raise CacheUnavailable(str(error) or type(error).__name__) from error

    def _name(self, key: CacheKey) -> str:
        # The model hex-encoded: no glob character of a model name can widen a clear's pattern.
        return f"{self._prefix}:e:{key.model.encode().hex()}:{key.digest}"

    def _stored_by(self, key_id: str) -> str:
        return f"{self._prefix}:k:{key_id}"

    def _claim(self, key: CacheKey) -> str:
        return f"{self._prefix}:f:{key.digest}"

    def _relay(self, key: CacheKey, token: str) -> str:
        return f"{self._prefix}:s:{key.digest}:{token}"

    async def get(self, key: CacheKey) -> Entry | None:
        async with self._answering(self._budget):
            value = await self._client.get(self._name(key))
        # (bytes: the client has no decode_responses)
        return decode_entry(value) if isinstance(value, bytes) else None

    async def put(self, key: CacheKey, entry: Entry, value: bytes) -> None:
        name, ttl_ms = self._name(key), max(1, round(entry.ttl * 1000))
        stored_by = self._stored_by(key.key_id)
        async with self._answering(self._budget), self._client.pipeline() as pipe:
            pipe.set(name, value, px=ttl_ms)
            pipe.sadd(stored_by, name)
            # The set outlives its newest entry; names of expired entries in it are harmless.
            pipe.pexpire(stored_by, ttl_ms, gt=True)
            pipe.pexpire(stored_by, ttl_ms, nx=True)
            await pipe.execute()

    async def clear(self, *, key_id: str | None = None, model: str | None = None) -> int:
        model_part = "*" if model is None else model.encode().hex()
        async with self._answering(None):  # an operator's clear: as long as the SCAN takes
            if key_id is not None:
                names: set[bytes] = set(await self._client.smembers(self._stored_by(key_id)))  # type: ignore[arg-type]
                if model is not None:
                    names = {n for n in names if n.startswith(self._name_prefix(model_part))}
                return await self._unlink(list(names))
            deleted = 0
            batch: list[bytes] = []
            async for name in self._client.scan_iter(
                match=f"{self._prefix}:e:{model_part}:*", count=500
            ):
                batch.append(name)
                if len(batch) >= 500:
                    deleted += await self._unlink(batch)
                    batch = []
            return deleted + await self._unlink(batch)

    def _name_prefix(self, model_hex: str) -> bytes:
        return f"{self._prefix}:e:{model_hex}:".encode()

    async def _unlink(self, names: list[bytes]) -> int:
        if not names:
            return 0
        deleted: int = await self._client.unlink(*names)
        return deleted

    def bytes_held(self) -> None:
        return None  # Redis's own memory figures say it; a replica does not count them

    async def lead(self, key: CacheKey) -> Claim | None:
        claim = Claim(key, uuid.uuid4().hex)
        name = self._claim(key)
        async with self._answering(self._budget):
            claimed = await self._client.set(name, claim.token, nx=True, px=self._claim_ms)
        if not claimed:
            return None
        self._claims[claim.token] = asyncio.ensure_future(self._keep(claim))
        return claim

    async def _keep(self, claim: Claim) -> None:
        """Renew a claim (and its relay) while its answer is fetched (it can take minutes)."""
        names = [self._claim(claim.key), self._relay(claim.key, claim.token)]
        args: list[str | int] = [claim.token, self._claim_ms, self._relay_ms]
        interval = self._claim_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                async with self._answering(interval):
                    if not await self._renew(keys=names, args=args):
                        return  # it expired meanwhile: another replica may lead now
            except CacheUnavailable:
                continue  # tried again; if Redis stays away, the claim expires

    async def relay(self, claim: Claim, events: Sequence[bytes]) -> None:
        name = self._relay(claim.key, claim.token)
        async with self._answering(self._budget), self._client.pipeline() as pipe:
            for event in events:
                pipe.xadd(name, {_EVENT: event})
            pipe.pexpire(name, self._relay_ms)
            await pipe.execute()

    async def landed(self, claim: Claim, relayed: Entry | None) -> None:
        renewing = self._claims.pop(claim.token, None)
        if renewing is not None:
            renewing.cancel()
        # The answer less its events: its followers hold those already.
        end = b"" if relayed is None else encode_entry(attrs.evolve(relayed, events=None))
        names = [self._claim(claim.key), self._relay(claim.key, claim.token)]
        async with self._answering(self._budget):
            await self._give_up(keys=names, args=[claim.token, end, self._claim_ms])

    async def follow(
        self, key: CacheKey, fetcher: str | None, cursor: str, wait: float
    ) -> Sighting:
        if fetcher is None or wait <= 0:
            return await self._look(key, fetcher, cursor, 0)
        if self._waiting_follows >= _WAITING_FOLLOWS:
            # Every connection a look may wait on is taken: wait here, holding none, then look.
            await asyncio.sleep(wait)
            return await self._look(key, fetcher, cursor, 0)
        self._waiting_follows += 1
        try:
            return await self._look(key, fetcher, cursor, round(wait * 1000))
        finally:
            self._waiting_follows -= 1

    async def _look(self, key: CacheKey, fetcher: str | None, cursor: str, block: int) -> Sighting:
        """One round trip: the claim, the entry, and (``fetcher``'s) relay after ``cursor``,
        waiting up to ``block`` ms for its next event (0: not waiting)."""
        async with (
            self._answering(self._look_budget + (block / 1000 + _BLOCK_LATENESS if block else 0)),
            self._client.pipeline(transaction=False) as pipe,
        ):
            # The claim read first: a fetch seen over was given up after its entry and its
            # relay's end were written, so both are seen too.
            pipe.get(self._claim(key))
            pipe.get(self._name(key))
            if fetcher is not None:
                # (BLOCK 0 would wait for ever: no BLOCK, no wait)
                pipe.xread({self._relay(key, fetcher): cursor}, block=block or None)
            claimed, value, *relayed = await pipe.execute()
        events: list[bytes] = []
        answer: Entry | None = None
        for _, entries in relayed[0] if relayed else ():
            for position, fields in entries:
                cursor = position.decode()
                if _EVENT in fields:
                    events.append(fields[_EVENT])
                elif fields.get(_END):
                    answer = decode_entry(fields[_END])
        return Sighting(
            claimed.decode() if isinstance(claimed, bytes) else None,
            decode_entry(value) if isinstance(value, bytes) else None,
            tuple(events),
            cursor,
            answer,
        )

    async def open(self) -> None:
        # The connection made now (and the client's first-use setup done), where a request's
        # 50 ms budget would otherwise pay for it.
        async with self._answering(_OPEN_SECONDS):
            await self._client.ping()

    async def close(self) -> None:
        renewals = list(self._claims.values())
        self._claims.clear()
        for renewing in renewals:
            renewing.cancel()
        for renewing in renewals:
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        await self._client.aclose()
