"""The cache as a module over a store: the same contract on memory and Redis, an injected clock."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from llmgw.accounting.usage import Usage
from llmgw.api.models import ModelListCache
from llmgw.cache.controls import Controls, read_controls
from llmgw.cache.entry import Entry, assemble_completion, decode_entry, encode_entry
from llmgw.cache.flight import FlightFailed
from llmgw.cache.key import CacheKey, cache_key, cacheable, scope_of
from llmgw.cache.policy import BYPASS, HIT, MISS, AliasCache, ResponseCache
from llmgw.cache.store import CacheStore, CacheUnavailable, MemoryCacheStore
from llmgw.config.providers_file import ProviderConfigError, load_provider_config
from llmgw.lifecycle.reload import ConfigReloader, RequestGenerations
from tests.lifecycle.test_reload import builds, registry_of
from tests.processes import Clock, free_port
from tests.stall_proxy import StallProxy

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = (
    b'{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"Hello","reasoning_content":"think","tool_calls":[{"id":"t1",'
    b'"type":"function","function":{"name":"f","arguments":"{\\"a\\":1}"}}]},'
    b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":5,'
    b'"total_tokens":8}}'
)
USAGE = Usage(input_tokens=3, output_tokens=5, cost_usd=0.25)


def _redis_store(clock: Clock) -> CacheStore:
    from llmgw.cache.redis import RedisCacheStore

    assert REDIS_URL is not None
    return RedisCacheStore(REDIS_URL, prefix=f"llmgw:test:{uuid.uuid4().hex}")


STORES = [
    pytest.param("memory", id="memory"),
    pytest.param(
        "redis",
        id="redis",
        marks=pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis"),
    ),
]


@pytest.fixture(params=STORES)
async def store_and_clock(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[CacheStore, Clock]]:
    clock = Clock()
    store: CacheStore = (
        MemoryCacheStore(max_bytes=1 << 20, clock=clock)
        if request.param == "memory"
        else _redis_store(clock)
    )
    yield store, clock
    await store.clear()
    await store.close()


def _cache(store: CacheStore, clock: Clock, **options: object) -> ResponseCache:
    options = {"max_entry_bytes": 1 << 20, **options}
    return ResponseCache(
        store,
        ttl_seconds=60,
        clock=clock,
        meter=MeterProvider().get_meter("test"),
        **options,  # type: ignore[arg-type]
    )


async def _lookup(cache: ResponseCache, key_id: str = "k1", **controls: object) -> object:
    return await cache.lookup(
        api="chat",
        model="m",
        body=BODY,
        key_id=key_id,
        subject_id="s1",
        controls=Controls(**controls),  # type: ignore[arg-type]
    )


async def _store_answer(cache: ResponseCache, key_id: str = "k1", **controls: object) -> None:
    lookup = await _lookup(cache, key_id, **controls)
    assert lookup.result == MISS  # type: ignore[attr-defined]
    written = cache.settle(lookup, usage=USAGE, body=COMPLETION)  # type: ignore[arg-type]
    assert written is not None
    await written


async def test_a_stored_answer_is_hit_until_its_ttl(
    store_and_clock: tuple[CacheStore, Clock],
) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    await _store_answer(cache)
    clock.now += 30
    hit = await _lookup(cache)
    assert hit.result == HIT and hit.age == 30  # type: ignore[attr-defined]
    assert hit.entry.body == COMPLETION and hit.entry.usage == USAGE  # type: ignore[attr-defined]
    clock.now += 31
    assert (await _lookup(cache)).result == MISS  # type: ignore[attr-defined]


async def test_max_age_and_the_callers_ttl(store_and_clock: tuple[CacheStore, Clock]) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    await _store_answer(cache, ttl=10)
    clock.now += 5
    too_old = await _lookup(cache, max_age=4)
    assert too_old.result == MISS  # type: ignore[attr-defined]
    cache.abandon(too_old)  # type: ignore[arg-type]
    assert (await _lookup(cache, max_age=5)).result == HIT  # type: ignore[attr-defined]
    clock.now += 6
    assert (await _lookup(cache)).result == MISS  # type: ignore[attr-defined]


async def test_no_store_and_no_cache(store_and_clock: tuple[CacheStore, Clock]) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    assert (await _lookup(cache, read=False, write=False)).result == BYPASS  # type: ignore[attr-defined]
    assert (await _lookup(cache)).result == MISS  # type: ignore[attr-defined]
    writer = await _lookup(cache, read=False)
    assert writer.result == BYPASS and writer.ttl == 60  # type: ignore[attr-defined]


async def test_keys_never_share_an_entry_under_the_key_scope(
    store_and_clock: tuple[CacheStore, Clock],
) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    await _store_answer(cache, "k1")
    assert (await _lookup(cache, "k2")).result == MISS  # type: ignore[attr-defined]
    shared = _cache(store, clock, scope="subject")
    await _store_answer(shared, "k1")
    assert (await _lookup(shared, "k2")).result == HIT  # type: ignore[attr-defined]


async def test_clear_by_key_and_by_model(store_and_clock: tuple[CacheStore, Clock]) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    await _store_answer(cache, "k1")
    await _store_answer(cache, "k2")
    assert await cache.clear(key_id="k1") == 1
    assert await cache.clear(model="other") == 0
    assert await cache.clear(model="m") == 1
    assert (await _lookup(cache, "k2")).result == MISS  # type: ignore[attr-defined]


async def test_an_answer_without_usage_or_larger_than_an_entry_is_not_stored(
    store_and_clock: tuple[CacheStore, Clock],
) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    lookup = await _lookup(cache)
    assert cache.settle(lookup, usage=Usage(), body=COMPLETION) is None  # type: ignore[arg-type]
    await cache.drained()  # its claim given up: the next cache (a replica) leads
    small = _cache(store, clock, max_entry_bytes=100)
    lookup = await _lookup(small)
    written = small.settle(lookup, usage=USAGE, body=COMPLETION)  # type: ignore[arg-type]
    assert written is not None
    await written
    assert (await _lookup(cache)).result == MISS  # type: ignore[attr-defined]


async def test_an_alias_can_turn_the_cache_off(store_and_clock: tuple[CacheStore, Clock]) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock, aliases={"m": AliasCache(enabled=False)})
    assert (await _lookup(cache)).result == BYPASS  # type: ignore[attr-defined]
    short = _cache(store, clock, aliases={"m": AliasCache(ttl_seconds=5)})
    assert (await _lookup(short)).ttl == 5  # type: ignore[attr-defined]


async def test_identical_requests_follow_the_leader(
    store_and_clock: tuple[CacheStore, Clock],
) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    leader = await _lookup(cache)
    follower = await _lookup(cache)
    assert follower.follows is not None  # type: ignore[attr-defined]
    waiting = asyncio.ensure_future(follower.follows.answer())  # type: ignore[attr-defined]
    events = follower.follows.stream()  # type: ignore[attr-defined]
    leader.event(b'data: {"choices":[{"index":0,"delta":{"content":"He"}}]}\n\n')  # type: ignore[attr-defined]
    first = await anext(events)
    assert b"He" in first and not waiting.done()
    leader.event(  # type: ignore[attr-defined]
        b'data: {"choices":[{"index":0,"delta":{"content":"llo"},"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
    )
    leader.completed()  # type: ignore[attr-defined]
    cache.settle(leader, usage=USAGE)  # type: ignore[arg-type]
    entry = await waiting
    assert entry is not None and entry.json_body().count(b"Hello") == 1
    assert [e async for e in events][-1].endswith(b"\n\n")


async def test_a_failed_leader_releases_its_followers(
    store_and_clock: tuple[CacheStore, Clock],
) -> None:
    store, clock = store_and_clock
    cache = _cache(store, clock)
    leader = await _lookup(cache)
    follower = await _lookup(cache)
    cache.abandon(leader)  # type: ignore[arg-type]
    assert await follower.follows.answer() is None  # type: ignore[attr-defined]
    assert not await follower.follows.first_event()  # type: ignore[attr-defined]
    await cache.drained()  # the claim given up, for every replica
    assert (await _lookup(cache)).result == MISS  # type: ignore[attr-defined]


async def test_a_store_of_one_process_is_asked_to_give_up_no_claim() -> None:
    """Its flights are every flight there is: a miss that ends, stored or not, claims and gives
    up nothing in the store, and runs nothing in the background but its entry's storing."""
    clock = Clock()
    cache = _cache(MemoryCacheStore(max_bytes=1 << 20, clock=clock), clock)
    running = asyncio.all_tasks()
    abandoned = await _lookup(cache, "k2")
    assert abandoned.result == MISS  # type: ignore[attr-defined]
    cache.abandon(abandoned)  # type: ignore[arg-type]
    assert cache.settle(await _lookup(cache, "k3"), usage=None) is None  # type: ignore[arg-type]
    not_kept = await _lookup(cache, ttl=0)
    assert cache.settle(not_kept, usage=USAGE, body=COMPLETION) is None  # type: ignore[arg-type]
    assert asyncio.all_tasks() == running
    await _store_answer(cache)  # a miss whose answer is stored
    assert asyncio.all_tasks() == running
    assert (await _lookup(cache)).result == HIT  # type: ignore[attr-defined]


def _replicas(
    claim_seconds: float = 5.0, budget_seconds: float = 0.05, **options: object
) -> tuple[ResponseCache, ResponseCache, Clock]:
    """Two replicas' caches on one Redis (one prefix), one clock."""
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    from llmgw.cache.redis import RedisCacheStore

    clock, prefix = Clock(), f"llmgw:test:{uuid.uuid4().hex}"
    one, two = (
        _cache(
            RedisCacheStore(
                REDIS_URL,
                prefix=prefix,
                claim_seconds=claim_seconds,
                budget_seconds=budget_seconds,
            ),
            clock,
            **options,
        )
        for _ in range(2)
    )
    return one, two, clock


# A streamed answer's chunk events (COMPLETION's).
CHUNKS = Entry(stored_at=0, ttl=60, usage=USAGE, body=COMPLETION).chunk_events()


async def test_a_replica_waits_for_the_answer_another_replica_fetches() -> None:
    one, two, _ = _replicas()
    leader = await _lookup(one)
    assert leader.result == MISS  # type: ignore[attr-defined]
    followers = [await _lookup(two) for _ in range(3)]
    assert [f.result for f in followers] == [HIT] * 3  # type: ignore[attr-defined]
    flights = {id(f.follows) for f in followers}  # type: ignore[attr-defined]
    assert len(flights) == 1  # one watch of the other replica, followed by all three
    waiting = asyncio.ensure_future(followers[0].follows.answer())  # type: ignore[attr-defined]
    await asyncio.sleep(0.1)  # a few looks at Redis while the answer is still being fetched
    assert not waiting.done()
    written = one.settle(leader, usage=USAGE, body=COMPLETION)  # type: ignore[arg-type]
    assert written is not None
    await written
    entry = await asyncio.wait_for(waiting, 5)
    assert entry is not None and entry.json_body() == COMPLETION
    events = [e async for e in followers[1].follows.stream()]  # type: ignore[attr-defined]
    assert assemble_completion(tuple(events))["choices"][0]["message"]["content"] == "Hello"
    assert (await _lookup(two)).entry is not None  # type: ignore[attr-defined]
    await one.close()
    await two.close()


async def test_a_follower_too_strict_for_the_stored_entry_waits_for_the_new_answer() -> None:
    """Under ``max-age``, an entry too old for the request is not its answer when another
    replica fetches a fresh one: the follower waits for that one, not the old entry."""
    one, two, clock = _replicas()
    await _store_answer(one)
    clock.now += 10
    leader = await _lookup(one, max_age=5)
    assert leader.result == MISS  # type: ignore[attr-defined]
    follower = await _lookup(two, max_age=5)
    assert follower.result == HIT  # type: ignore[attr-defined]
    waiting = asyncio.ensure_future(follower.follows.answer())  # type: ignore[attr-defined]
    await asyncio.sleep(0.1)  # a few looks at Redis, which holds the old entry
    assert not waiting.done()
    written = one.settle(leader, usage=USAGE, body=COMPLETION)  # type: ignore[arg-type]
    assert written is not None
    await written
    entry = await asyncio.wait_for(waiting, 5)
    assert entry is not None and entry.age(clock.now) == 0
    await one.close()
    await two.close()


@pytest.mark.parametrize("max_entry_bytes", [1 << 20, 10], ids=["stored", "too-big-to-store"])
async def test_a_replica_relays_a_streamed_answer_to_another_as_it_comes(
    max_entry_bytes: int,
) -> None:
    one, two, _ = _replicas(max_entry_bytes=max_entry_bytes)
    leader = await _lookup(one)
    follower = await _lookup(two)
    flight = follower.follows  # type: ignore[attr-defined]
    leader.event(CHUNKS[0])  # type: ignore[attr-defined]
    assert await asyncio.wait_for(flight.first_event(), 5)
    assert flight.events == [CHUNKS[0]] and not flight.ended  # the leader's answer still coming
    replayed = asyncio.ensure_future(_collected(flight.stream()))
    for event in CHUNKS[1:]:
        leader.event(event)  # type: ignore[attr-defined]
    leader.completed()  # type: ignore[attr-defined]
    written = one.settle(leader, usage=USAGE)  # type: ignore[arg-type]
    assert written is not None
    await written
    assert await asyncio.wait_for(replayed, 5) == list(CHUNKS)
    # Its end carries the rest of the answer, stored or not (too big to store, here).
    entry = await flight.answer()
    assert entry is not None and entry.events == CHUNKS and entry.usage == USAGE
    stored = await _lookup(two)
    assert (stored.entry is not None) is (max_entry_bytes > 10)  # type: ignore[attr-defined]
    await one.close()
    await two.close()


async def _collected(events: AsyncIterator[bytes]) -> list[bytes]:
    return [event async for event in events]


async def test_a_stream_broken_on_one_replica_ends_the_followers_on_another() -> None:
    one, two, _ = _replicas()
    leader = await _lookup(one)
    follower = await _lookup(two)
    flight = follower.follows  # type: ignore[attr-defined]
    leader.event(CHUNKS[0])  # type: ignore[attr-defined]
    assert await asyncio.wait_for(flight.first_event(), 5)
    leader.broken()  # type: ignore[attr-defined]
    one.abandon(leader)  # type: ignore[arg-type]
    # A follower sent part of it ends with an error; one sent nothing calls on its own.
    with pytest.raises(FlightFailed):
        await asyncio.wait_for(_collected(flight.stream()), 5)
    assert await flight.answer() is None
    await one.close()
    await two.close()


async def test_a_stream_whose_replica_died_ends_its_followers_once_its_claim_expires() -> None:
    one, two, _ = _replicas(claim_seconds=0.3)
    leader = await _lookup(one)
    follower = await _lookup(two)
    flight = follower.follows  # type: ignore[attr-defined]
    leader.event(CHUNKS[0])  # type: ignore[attr-defined]
    assert await asyncio.wait_for(flight.first_event(), 5)
    await one.store.close()  # its claim's renewal stops, as with a process gone
    with pytest.raises(FlightFailed):
        await asyncio.wait_for(_collected(flight.stream()), 5)
    await two.close()


async def test_a_streamed_answer_whose_entry_redis_refused_still_reaches_the_followers() -> None:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    from llmgw.cache.redis import RedisCacheStore

    class Refusing(RedisCacheStore):
        async def put(self, key: CacheKey, entry: Entry, value: bytes) -> None:
            raise CacheUnavailable("OOM command not allowed when used memory > 'maxmemory'")

    clock, prefix = Clock(), f"llmgw:test:{uuid.uuid4().hex}"
    one = _cache(Refusing(REDIS_URL, prefix=prefix), clock)
    two = _cache(RedisCacheStore(REDIS_URL, prefix=prefix), clock)
    leader = await _lookup(one)
    follower = await _lookup(two)
    flight = follower.follows  # type: ignore[attr-defined]
    for event in CHUNKS:
        leader.event(event)  # type: ignore[attr-defined]
    leader.completed()  # type: ignore[attr-defined]
    assert await asyncio.wait_for(flight.first_event(), 5)
    one.settle(leader, usage=USAGE)  # type: ignore[arg-type]
    # The claim is given up with the relay's end at once, not left to expire in 5 s.
    assert await asyncio.wait_for(_collected(flight.stream()), 2) == list(CHUNKS)
    await one.close()
    await two.close()


async def test_a_relay_cut_off_by_an_unreachable_redis_leaves_the_leader_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    from llmgw.cache.redis import RedisCacheStore

    proxy, stalling = await StallProxy.before(REDIS_URL)
    clock, prefix = Clock(), f"llmgw:test:{uuid.uuid4().hex}"
    through = RedisCacheStore(stalling, prefix=prefix)
    one, two = _cache(through, clock), _cache(RedisCacheStore(REDIS_URL, prefix=prefix), clock)
    leader = await _lookup(one)
    local = await _lookup(one)  # a follower on the leader's own replica
    follower = await _lookup(two)
    proxy.pause()  # Redis stalls for the leader's replica: no write of its relay lands
    with caplog.at_level(logging.WARNING, logger="llmgw.cache.policy"):
        for event in CHUNKS:
            leader.event(event)  # type: ignore[attr-defined]
        leader.completed()  # type: ignore[attr-defined]
        written = one.settle(leader, usage=USAGE)  # type: ignore[arg-type]
        assert written is not None
        # The leader's own answer and its replica's followers have it all at once.
        assert await _collected(local.follows.stream()) == list(CHUNKS)  # type: ignore[attr-defined]
        await written
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1
    # The other replica saw nothing of it and, once the claim expires, calls on its own.
    assert follower.follows.events == []  # type: ignore[attr-defined]
    await proxy.close()
    await one.close()
    await two.close()


async def test_a_replica_whose_leader_failed_or_died_calls_on_its_own() -> None:
    one, two, _ = _replicas(claim_seconds=0.3)
    leader = await _lookup(one)
    follower = await _lookup(two)
    one.abandon(leader)  # type: ignore[arg-type]
    assert await asyncio.wait_for(follower.follows.answer(), 5) is None  # type: ignore[attr-defined]
    await one.drained()
    # A leader whose replica dies holds nothing for long: its claim is not renewed, and expires.
    assert (await _lookup(one)).result == MISS  # type: ignore[attr-defined]
    await one.store.close()  # its claim's renewal stops, as with a process gone
    follower = await _lookup(two)
    assert follower.result == HIT  # type: ignore[attr-defined]
    assert await asyncio.wait_for(follower.follows.answer(), 5) is None  # type: ignore[attr-defined]
    assert (await _lookup(two)).result == MISS  # type: ignore[attr-defined]
    await two.close()


async def test_a_claim_outlives_its_expiry_while_its_answer_is_fetched() -> None:
    one, two, _ = _replicas(claim_seconds=0.3)
    leader = await _lookup(one)
    await asyncio.sleep(1.0)  # three expiries: renewed meanwhile
    follower = await _lookup(two)
    assert follower.result == HIT  # type: ignore[attr-defined]
    one.settle(leader, usage=USAGE, body=COMPLETION)  # type: ignore[arg-type]
    entry = await asyncio.wait_for(follower.follows.answer(), 5)  # type: ignore[attr-defined]
    assert entry is not None
    await one.close()
    await two.close()


async def test_followers_of_many_fetches_at_once_leave_redis_to_the_lookups(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica following more fetches at once than it has Redis connections for (each look
    that waits for a relayed event holds one): every follower still gets its answer, and the
    replica's other lookups still read Redis, not bypass it as if it were down."""
    # Budgets no pause of this test process can overrun: what is tested is connections.
    one, two, _ = _replicas(budget_seconds=2.0)
    await _store_answer(two, key_id="stored")

    async def look(cache: ResponseCache, n: int) -> object:
        body = {**BODY, "messages": [{"role": "user", "content": f"q{n}"}]}
        return await cache.lookup(
            api="chat", model="m", body=body, key_id="k1", subject_id=None, controls=Controls()
        )

    fetches = 120  # more than the 100 connections newer redis-py versions allow by default
    leaders = [await look(one, n) for n in range(fetches)]
    assert {leader.result for leader in leaders} == {MISS}  # type: ignore[attr-defined]
    followers = [await look(two, n) for n in range(fetches)]  # each following from now on
    assert {follower.result for follower in followers} == {HIT}  # type: ignore[attr-defined]
    answers = [
        asyncio.ensure_future(f.follows.answer())  # type: ignore[attr-defined]
        for f in followers
    ]
    await asyncio.sleep(0.3)  # every follow under way, waiting on Redis
    with caplog.at_level(logging.WARNING, logger="llmgw.cache.policy"):
        assert (await _lookup(two, key_id="stored")).result == HIT  # type: ignore[attr-defined]
        assert not any(answer.done() for answer in answers)  # none gave up on Redis
        for leader in leaders:  # the answers coming in one after another
            written = one.settle(leader, usage=USAGE, body=COMPLETION)  # type: ignore[arg-type]
            assert written is not None
            await written
        entries = await asyncio.wait_for(asyncio.gather(*answers), 10)
    assert all(entry is not None for entry in entries)
    assert "unreachable" not in caplog.text
    await one.close()
    await two.close()


async def test_memory_never_exceeds_its_bytes_under_a_flood() -> None:
    clock = Clock()
    evicted: list[int] = []
    store = MemoryCacheStore(max_bytes=50_000, clock=clock, on_evict=evicted.append)
    cache = _cache(store, clock)
    for n in range(2000):
        lookup = await cache.lookup(
            api="chat",
            model="m",
            body={**BODY, "n": n},
            key_id="k",
            subject_id=None,
            controls=Controls(),
        )
        written = cache.settle(lookup, usage=USAGE, body=COMPLETION.replace(b"Hello", b"x" * n))
        assert written is not None
        await written
        assert store.bytes_held() <= 50_000
    assert sum(evicted) > 1000
    # The most recent answers are the ones kept.
    last = await cache.lookup(
        api="chat",
        model="m",
        body={**BODY, "n": 1999},
        key_id="k",
        subject_id=None,
        controls=Controls(),
    )
    assert last.result == HIT


async def test_an_unreachable_redis_is_a_bypass_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("redis")
    from llmgw.cache.redis import RedisCacheStore

    clock = Clock()
    store = RedisCacheStore(f"redis://127.0.0.1:{free_port()}/0")
    reader = InMemoryMetricReader()
    cache = ResponseCache(
        store,
        ttl_seconds=60,
        max_entry_bytes=1 << 20,
        clock=clock,
        meter=MeterProvider(metric_readers=[reader]).get_meter("test"),
    )
    with caplog.at_level(logging.WARNING, logger="llmgw.cache.policy"):
        for _ in range(3):
            assert (await _lookup(cache)).result == BYPASS  # type: ignore[attr-defined]
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1
    data = reader.get_metrics_data()
    points = [
        (dict(p.attributes), p.value)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "llmgw.cache.lookups"
        for p in m.data.data_points
    ]
    assert points == [({"llmgw.cache.result": "bypass"}, 3)]
    await store.close()


def test_the_key_ignores_stream_and_key_order() -> None:
    a = cache_key("chat", "m", "key:1", {"model": "m", "stream": True, "x": [1, 2]}, "1")
    b = cache_key("chat", "m", "key:1", {"x": [1, 2], "model": "m", "stream_options": {}}, "1")
    assert a == b
    assert a != cache_key("chat", "m", "key:2", {"model": "m", "x": [1, 2]}, "2")
    assert a != cache_key("messages", "m", "key:1", {"model": "m", "x": [1, 2]}, "1")
    assert scope_of("key", "k", "s") == "key:k"
    assert scope_of("subject", "k", "s", "t") == "subject:s"
    assert scope_of("team", "k", "s", "t") == "team:t"
    assert scope_of("subject", "k", None) == "key:k" == scope_of("team", "k", "s", None)
    assert scope_of("shared", "k", "s") == "shared"
    assert cacheable("responses", {"store": False})
    assert not cacheable("responses", {})
    assert not cacheable("responses", {"store": False, "previous_response_id": "r"})


def test_controls_are_read_from_http_headers() -> None:
    assert read_controls({}) == Controls()
    assert read_controls({"Cache-Control": "no-store"}) == Controls(read=False, write=False)
    assert read_controls({"Cache-Control": "No-Cache"}) == Controls(read=False)
    assert read_controls({"Cache-Control": "max-age=30, foo"}).max_age == 30
    assert read_controls({"Cache-Control": "max-age=-1"}).max_age is None
    assert read_controls({"X-LLMGW-Cache-TTL": "7"}).ttl == 7


def test_a_json_answer_and_its_stream_are_the_same_answer() -> None:
    entry = Entry(stored_at=0, ttl=1, usage=USAGE, body=COMPLETION)
    again = assemble_completion(entry.chunk_events())
    import orjson

    original = orjson.loads(COMPLETION)
    assert again["choices"][0]["message"] == original["choices"][0]["message"]
    assert again["choices"][0]["finish_reason"] == "tool_calls"
    assert again["usage"] == original["usage"]
    assert decode_entry(encode_entry(entry)) == entry
    assert decode_entry(b"not an entry") is None


async def test_a_failing_lookup_is_a_bypass(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(MemoryCacheStore):
        async def get(self, key: CacheKey) -> Entry | None:
            raise RuntimeError("a bug")

    clock = Clock()
    cache = _cache(Broken(max_bytes=1024, clock=clock), clock)
    with caplog.at_level(logging.ERROR, logger="llmgw.cache.policy"):
        assert (await _lookup(cache)).result == BYPASS  # type: ignore[attr-defined]
    assert "bypassed" in caplog.text


def test_an_alias_says_cache_false_or_its_own_ttl_in_the_providers_file(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        '[[providers]]\nname = "local"\nkind = "openai-compatible"\nbase_url = "http://127.0.0.1:9"\n'
        '[[models]]\nalias = "private"\ndeployments = ["local:m"]\ncache = false\n'
        '[[models]]\nalias = "short"\ndeployments = ["local:m"]\ncache_ttl_seconds = 60\n'
        '[[models]]\nalias = "plain"\ndeployments = ["local:m"]\n'
    )
    aliases = {a.alias: a for a in load_provider_config(path, {}).model_aliases}
    assert (aliases["private"].cache, aliases["private"].cache_ttl_seconds) == (False, None)
    assert (aliases["short"].cache, aliases["short"].cache_ttl_seconds) == (True, 60)
    assert (aliases["plain"].cache, aliases["plain"].cache_ttl_seconds) == (True, None)
    path.write_text(path.read_text().replace("= 60", "= 0"))
    with pytest.raises(ProviderConfigError, match="cache_ttl_seconds"):
        load_provider_config(path, {})


async def test_a_reload_brings_what_each_alias_says_of_the_response_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("VENICE_API_KEY", "unused")
    config = tmp_path / "llmgw.toml"
    provider = '[[providers]]\nname = "local"\nkind = "openai-compatible"\nbase_url = "http://127.0.0.1:9/v1"\n'
    alias = '[[models]]\nalias = "a"\ndeployments = ["local:m"]\n'
    monkeypatch.setenv("LLMGW_CONFIG", str(config))
    clock = Clock()
    cache = ResponseCache(
        MemoryCacheStore(max_bytes=1 << 20, clock=clock),
        ttl_seconds=60,
        max_entry_bytes=1 << 20,
        clock=clock,
    )
    reloader = ConfigReloader(
        registry_of("local"),
        builds("local"),
        ModelListCache(),
        RequestGenerations(),
        cache=cache,
    )

    async def looked_up() -> tuple[str, float]:
        lookup = await cache.lookup(
            api="chat",
            model="a",
            body={"model": "a", "messages": []},
            key_id="k",
            subject_id=None,
            controls=Controls(),
        )
        cache.abandon(lookup)
        return lookup.result, lookup.ttl

    assert await looked_up() == (MISS, 60)
    config.write_text(provider + alias + "cache_ttl_seconds = 5\n")
    assert await reloader.reload() is True
    assert await looked_up() == (MISS, 5)
    config.write_text(provider + alias + "cache = false\n")
    assert await reloader.reload() is True
    assert (await looked_up())[0] == BYPASS
    config.write_text(provider + alias)  # the alias's own say removed: the configured TTL
    assert await reloader.reload() is True
    assert await looked_up() == (MISS, 60)
    await reloader.close()
    await cache.close()
