"""The response cache through the gateway, driven by the real SDKs, on memory and on Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.clocks import Clocks
from llmgw.config.providers_file import DeploymentSpec, ModelAlias
from llmgw.key_format import key_prefix
from llmgw.lifecycle.reload import RELOADER
from llmgw.storage import api_keys, teams
from tests.conftest import FAKE_VENICE_KEY, Gateway
from tests.fake_venice import Behaviour
from tests.processes import Clock, clean_env, eventually, free_port
from tests.stall_proxy import StallProxy

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")

BACKENDS = [
    pytest.param({"cache": "memory"}, id="memory"),
    pytest.param(
        {"cache": "redis", "redis_url": REDIS_URL},
        id="redis",
        marks=pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis"),
    ),
]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=BACKENDS)
async def cached(request: pytest.FixtureRequest, start_gateway: Any) -> Gateway:
    gateway: Gateway = await start_gateway(**request.param)
    return gateway


async def _chat(gateway: Gateway, key: str, *, stream: bool = False, **headers: str) -> Any:
    async with gateway.client(key) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-5-9b",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=stream,
            extra_headers=headers or None,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        if not stream:
            return raw.headers, raw.parse()
        text, finish, usage = "", None, None
        async for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return raw.headers, (text, finish, usage)


async def _stored(gateway: Gateway, key: str, **headers: str) -> None:
    """A Redis write lands after the answer: wait until the cache answers."""

    async def hit() -> bool:
        found, _ = await _chat(gateway, key, **headers)
        return bool(found["x-llmgw-cache"] == "hit")

    await eventually(hit)


async def test_a_repeat_is_a_hit_with_the_same_answer_in_both_forms(cached: Gateway) -> None:
    key = await cached.create_key()
    headers, first = await _chat(cached, key)
    assert headers["x-llmgw-cache"] == "miss"
    await _stored(cached, key)
    headers, again = await _chat(cached, key)
    assert headers["x-llmgw-cache"] == "hit" and "age" in headers
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.total_tokens == first.usage.total_tokens
    headers, (text, finish, usage) = await _chat(cached, key, stream=True)
    assert headers["x-llmgw-cache"] == "hit"
    assert text == first.choices[0].message.content
    assert finish == first.choices[0].finish_reason
    assert usage.total_tokens == first.usage.total_tokens
    assert len(cached.fake.chats()) == 1


async def test_a_streamed_answer_serves_a_json_request(cached: Gateway) -> None:
    key = await cached.create_key()
    headers, (text, finish, usage) = await _chat(cached, key, stream=True)
    assert headers["x-llmgw-cache"] == "miss"
    await _stored(cached, key)
    _, answer = await _chat(cached, key)
    assert answer.choices[0].message.content == text
    assert answer.choices[0].finish_reason == finish
    assert answer.usage.total_tokens == usage.total_tokens
    headers, (again, _, _) = await _chat(cached, key, stream=True)
    assert headers["x-llmgw-cache"] == "hit" and again == text
    assert len(cached.fake.chats()) == 1


async def test_one_key_never_reads_another_keys_entry(cached: Gateway) -> None:
    owner, other = await cached.create_key(), await cached.create_key()
    await _chat(cached, owner)
    await _stored(cached, owner)
    headers, _ = await _chat(cached, other)
    assert headers["x-llmgw-cache"] == "miss"
    assert len(cached.fake.chats()) == 2


async def test_controls(cached: Gateway) -> None:
    key = await cached.create_key()
    headers, _ = await _chat(cached, key, **{"Cache-Control": "no-store"})
    assert headers["x-llmgw-cache"] == "bypass"
    headers, _ = await _chat(cached, key)
    assert headers["x-llmgw-cache"] == "miss"  # no-store wrote nothing
    await _stored(cached, key)
    headers, _ = await _chat(cached, key, **{"Cache-Control": "no-cache"})
    assert headers["x-llmgw-cache"] == "bypass"
    calls = len(cached.fake.chats())
    await _stored(cached, key)
    headers, _ = await _chat(cached, key, **{"Cache-Control": "max-age=0"})
    assert headers["x-llmgw-cache"] in ("hit", "miss")  # an entry stored this very second is 0 old
    assert len(cached.fake.chats()) >= calls


async def test_errors_and_cut_streams_are_not_stored(cached: Gateway) -> None:
    key = await cached.create_key()
    cached.fake.enqueue(Behaviour(status=400))
    async with aiohttp.ClientSession() as session:
        body = {"model": "qwen3-5-9b", "messages": MESSAGES}
        auth = {"Authorization": f"Bearer {key}"}
        response = await session.post(cached.url("/v1/chat/completions"), json=body, headers=auth)
        assert response.status == 400
        cached.fake.enqueue(Behaviour(drop_after_chunks=2))
        response = await session.post(
            cached.url("/v1/chat/completions"), json={**body, "stream": True}, headers=auth
        )
        await response.read()
    await asyncio.sleep(0.05)
    headers, _ = await _chat(cached, key)
    assert headers["x-llmgw-cache"] == "miss"


async def test_ten_identical_requests_make_one_upstream_call(cached: Gateway) -> None:
    key = await cached.create_key()
    cached.fake.enqueue(Behaviour(delay_before_headers=0.3))
    answers = await asyncio.gather(*(_chat(cached, key, stream=bool(i % 2)) for i in range(10)))
    assert len(cached.fake.chats()) == 1
    results = sorted(headers["x-llmgw-cache"] for headers, _ in answers)
    assert results == ["hit"] * 9 + ["miss"]
    texts = {a.choices[0].message.content if not isinstance(a, tuple) else a[0] for _, a in answers}
    assert len(texts) == 1


async def test_a_failed_leader_sends_each_follower_to_the_provider(cached: Gateway) -> None:
    key = await cached.create_key()
    cached.fake.enqueue(Behaviour(status=400, delay_before_headers=0.3))
    async with aiohttp.ClientSession() as session:
        body = {"model": "qwen3-5-9b", "messages": MESSAGES}
        auth = {"Authorization": f"Bearer {key}"}

        async def post() -> int:
            async with session.post(
                cached.url("/v1/chat/completions"), json=body, headers=auth
            ) as response:
                await response.read()
                return response.status

        statuses = await asyncio.gather(*(post() for _ in range(3)))
    assert sorted(statuses) == [200, 200, 400]
    assert len(cached.fake.chats()) == 3


async def test_the_ledger_and_usage_api_show_hits_at_no_cost(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory", admin_token="a" * 32)
    key = await gateway.create_key()
    await _chat(gateway, key)
    await _chat(gateway, key)

    async def rows() -> list[Any]:
        return list(
            await gateway.db.fetch(
                "SELECT cache_hit, cost_usd, saved_cost_usd, input_tokens, output_tokens,"
                " api_key_id FROM usage_events WHERE api_key_id = "
                "(SELECT id FROM api_keys ORDER BY created_at DESC LIMIT 1) ORDER BY id"
            )
        )

    await eventually(lambda: _count(rows, 2))
    miss, hit = await rows()
    assert not miss["cache_hit"] and miss["cost_usd"] > 0
    assert hit["cache_hit"] and hit["cost_usd"] == 0
    assert hit["saved_cost_usd"] == miss["cost_usd"]
    assert hit["input_tokens"] == miss["input_tokens"]
    async with aiohttp.ClientSession() as session:
        response = await session.get(
            gateway.url("/admin/v1/usage"),
            params={"key_id": str(hit["api_key_id"]), "group_by": "key"},
            headers={"Authorization": "Bearer " + "a" * 32},
        )
        (group,) = (await response.json())["data"]
        assert group["requests"] == 2 and group["cache_hits"] == 1
        assert float(group["saved_cost_usd"]) == float(miss["cost_usd"])
        response = await session.get(
            gateway.url("/admin/v1/usage/report"),
            params={"key_id": str(hit["api_key_id"]), "by": "model"},
            headers={"Authorization": "Bearer " + "a" * 32},
        )
        (row,) = (await response.json())["data"]
        assert (row["requests"], row["cache_hits"]) == (2, 1)
        assert float(row["saved_cost_usd"]) == float(miss["cost_usd"])

        async def overview() -> dict[str, Any]:
            response = await session.get(
                gateway.url("/admin/v1/overview"),
                headers={"Authorization": "Bearer " + "a" * 32},
            )
            today: dict[str, Any] = (await response.json())["today"]
            return today

        # The console's overview: the hit rate and the spend saved today (its rollup is
        # written after the ledger's rows).
        await eventually(lambda: _overview_counts(overview, 2))
        today = await overview()
        assert (today["cache_hits"], today["cache_hit_rate"]) == (1, 0.5)
        assert float(today["saved_cost_usd"]) == float(miss["cost_usd"])


async def _overview_counts(overview: Any, requests: int) -> bool:
    return bool((await overview())["requests"] == requests)


async def _count(rows: Any, n: int) -> bool:
    return len(await rows()) == n


async def test_admin_clear_deletes_entries(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory", admin_token="a" * 32)
    key = await gateway.create_key()
    await _chat(gateway, key)
    async with aiohttp.ClientSession() as session:
        response = await session.delete(
            gateway.url("/admin/v1/cache"),
            params={"model": "qwen3-5-9b"},
            headers={"Authorization": "Bearer " + "a" * 32},
        )
        assert response.status == 200
        assert await response.json() == {"deleted": 1}
    headers, _ = await _chat(gateway, key)
    assert headers["x-llmgw-cache"] == "miss"


async def test_a_stopped_redis_gives_bypass_and_200(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(
        cache="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0"
    )
    key = await gateway.create_key()
    for _ in range(2):
        headers, answer = await _chat(gateway, key)
        assert headers["x-llmgw-cache"] == "bypass"
        assert answer.choices[0].message.content


async def test_messages_both_forms_from_one_entry(cached: Gateway) -> None:
    key = await cached.create_key()
    async with cached.anthropic_client(key) as client:
        first = await client.messages.with_raw_response.create(
            model="qwen3-5-9b", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
        assert first.headers["x-llmgw-cache"] == "miss"
        message = await first.parse()

        async def streamed() -> tuple[str, Any, Any]:
            async with client.messages.stream(
                model="qwen3-5-9b", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                final = await stream.get_final_message()
                return stream.response.headers["x-llmgw-cache"], final, final.usage

        _, final, usage = await eventually_hit(streamed)
    assert final.content[0].text == message.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == message.stop_reason
    assert usage.output_tokens == message.usage.output_tokens
    assert len(cached.fake.chats()) == 1


async def eventually_hit(call: Any) -> Any:
    """A Redis write lands just after the answer: the first repeat that is a hit."""
    for _ in range(50):
        result = await call()
        if result[0] == "hit":
            return result
        await asyncio.sleep(0.02)
    raise AssertionError("never a hit")


async def test_responses_without_state_are_cached_and_with_state_are_not(cached: Gateway) -> None:
    key = await cached.create_key()
    async with cached.client(key) as client:
        raw = await client.responses.with_raw_response.create(
            model="qwen3-5-9b", input="hi", store=False
        )
        assert raw.headers["x-llmgw-cache"] == "miss"
        first = raw.parse()

        async def streamed() -> tuple[str, str]:
            raw = await client.responses.with_raw_response.create(
                model="qwen3-5-9b", input="hi", store=False, stream=True
            )
            text = ""
            async for event in raw.parse():
                if event.type == "response.output_text.delta":
                    text += event.delta
            return raw.headers["x-llmgw-cache"], text

        _, text = await eventually_hit(streamed)
        assert text == first.output_text
        stored = await client.responses.with_raw_response.create(model="qwen3-5-9b", input="hi")
        assert stored.headers["x-llmgw-cache"] == "bypass"


async def test_tool_calls_and_reasoning_replay_in_both_forms(cached: Gateway) -> None:
    cached.fake.reasoning = "Let me think."
    key = await cached.create_key()
    body = {"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True}
    auth = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            cached.url("/v1/chat/completions"), json=body, headers=auth
        ) as response:
            assert response.headers["X-LLMGW-Cache"] == "miss"
            streamed = await response.read()

        async def as_json() -> tuple[str, dict[str, Any]]:
            async with session.post(
                cached.url("/v1/chat/completions"), json={**body, "stream": False}, headers=auth
            ) as response:
                return response.headers["X-LLMGW-Cache"], await response.json()

        _, answer = await eventually_hit(as_json)
    message = answer["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me think."
    assert b'"reasoning_content":"Let me' in streamed
    assert b'"usage"' not in streamed  # the caller did not ask for it
    assert answer["usage"]["total_tokens"] > 0


async def test_two_replicas_on_one_redis_share_hits(start_gateway: Any) -> None:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    one = await start_gateway(cache="redis", redis_url=REDIS_URL)
    two = await start_gateway(cache="redis", redis_url=REDIS_URL)
    key = await one.create_key()
    headers, first = await _chat(one, key)
    assert headers["x-llmgw-cache"] == "miss"

    async def from_two() -> tuple[str, Any]:
        headers, answer = await _chat(two, key)
        return headers["x-llmgw-cache"], answer

    _, again = await eventually_hit(from_two)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert len(one.fake.chats()) == 1


async def test_ten_identical_requests_on_two_replicas_make_one_upstream_call(
    start_gateway: Any,
) -> None:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    one = await start_gateway(cache="redis", redis_url=REDIS_URL)
    two = await start_gateway(cache="redis", redis_url=REDIS_URL)
    key = await one.create_key()
    one.fake.enqueue(Behaviour(delay_before_headers=0.5))
    leading = asyncio.ensure_future(_chat(one, key))
    await eventually(lambda: len(one.fake.chats()) == 1)  # replica one fetches it
    answers = await asyncio.gather(
        *(_chat((one, two)[i % 2], key, stream=i % 3 == 0) for i in range(9))
    )
    answers.append(await leading)
    assert len(one.fake.chats()) == 1
    assert sorted(headers["x-llmgw-cache"] for headers, _ in answers) == ["hit"] * 9 + ["miss"]
    texts = {a.choices[0].message.content if not isinstance(a, tuple) else a[0] for _, a in answers}
    assert len(texts) == 1


async def _two_replicas(
    start_gateway: Any, redis_url: str | None = None
) -> tuple[Gateway, Gateway]:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    one = await start_gateway(cache="redis", redis_url=redis_url or REDIS_URL)
    two = await start_gateway(cache="redis", redis_url=REDIS_URL)
    return one, two


async def _open_stream(gateway: Gateway, key: str) -> tuple[Any, Any]:
    """A streamed chat's headers, and its chunks to read one at a time."""
    client = gateway.client(key)
    raw = await client.chat.completions.with_raw_response.create(
        model="qwen3-5-9b",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    return raw.headers, aiter(raw.parse())


async def _rest(chunks: Any) -> list[Any]:
    return [chunk.model_dump() async for chunk in chunks]


def _lookups(gateway: Gateway) -> dict[str, int]:
    data = gateway.telemetry.metrics.get_metrics_data()
    return {
        p.attributes["llmgw.cache.result"]: p.value
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "llmgw.cache.lookups"
        for p in m.data.data_points
    }


async def test_a_streamed_follower_on_another_replica_gets_events_as_they_arrive(
    start_gateway: Any,
) -> None:
    one, two = await _two_replicas(start_gateway)
    key = await one.create_key()
    hold = asyncio.Event()  # the upstream stream stops before its third chunk until set
    one.fake.enqueue(Behaviour(hold=hold, held_at=2))
    async with asyncio.timeout(20):  # a follower served only at the end would wait for ever
        _, leading = await _open_stream(one, key)
        leader = [(await anext(leading)).model_dump()]  # replica one fetches it
        headers, following = await _open_stream(two, key)
        assert headers["x-llmgw-cache"] == "hit"
        follower = [(await anext(following)).model_dump()]
        assert not hold.is_set() and one.fake.completed_streams == 0
        hold.set()
        leader += await _rest(leading)
        follower += await _rest(following)
    assert follower == leader
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in leader if c["choices"])
    assert len(one.fake.chats()) == 1


async def test_a_stream_broken_on_one_replica_ends_its_followers_on_another(
    start_gateway: Any,
) -> None:
    one, two = await _two_replicas(start_gateway)
    key = await one.create_key()
    hold = asyncio.Event()
    one.fake.enqueue(Behaviour(hold=hold, held_at=2, drop_after_chunks=3))
    async with asyncio.timeout(20):
        _, leading = await _open_stream(one, key)
        await anext(leading)
        headers, following = await _open_stream(two, key)
        assert headers["x-llmgw-cache"] == "hit"
        await anext(following)  # sent part of the answer
        waiting = asyncio.ensure_future(_chat(two, key))  # sent nothing: a JSON follower
        await eventually(lambda: _lookups(two).get("hit") == 2, what="both follow replica one")
        hold.set()
        with pytest.raises(openai.APIError):
            await _rest(following)
        await _rest(leading)  # (its caller's stream goes on from a new call: spliced, not shared)
        headers, answer = await waiting
    assert headers["x-llmgw-cache"] == "miss" and answer.choices[0].message.content
    assert [chat.json["stream"] for chat in one.fake.chats()].count(False) == 1  # its own call


async def test_redis_stalling_while_a_replica_leads_leaves_its_answer_alone(
    start_gateway: Any, caplog: pytest.LogCaptureFixture
) -> None:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    proxy, stalling = await StallProxy.before(REDIS_URL)
    try:
        one, _ = await _two_replicas(start_gateway, stalling)
        key = await one.create_key()
        hold = asyncio.Event()
        one.fake.enqueue(Behaviour(hold=hold, held_at=2))
        with caplog.at_level(logging.WARNING, logger="llmgw.cache.policy"):
            async with asyncio.timeout(20):
                headers, leading = await _open_stream(one, key)
                first = await anext(leading)  # its claim taken, its relay begun
                proxy.pause()  # nothing more it sends Redis arrives
                hold.set()
                chunks = [first.model_dump(), *await _rest(leading)]
            await eventually(
                lambda: any("unreachable" in r.message for r in caplog.records),
                what="the outage seen by the writes that follow the answer",
            )
    finally:
        await proxy.close()
    assert headers["x-llmgw-cache"] == "miss"
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
    assert text == one.fake.reply
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert len([r for r in caplog.records if "unreachable" in r.message]) == 1


async def test_a_hit_counts_against_the_request_rate(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    key = await gateway.create_key(rate_limit_requests=2, rate_limit_window_seconds=60)
    await _chat(gateway, key)
    headers, _ = await _chat(gateway, key)
    assert headers["x-llmgw-cache"] == "hit"
    async with gateway.client(key) as client:
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)  # type: ignore[arg-type]


async def test_a_key_whose_tokens_per_minute_are_used_up_still_gets_its_stored_answers(
    start_gateway: Any,
) -> None:
    """A hit uses no provider's tokens, so the tokens-per-minute limit neither counts it nor
    refuses it; a request the cache cannot answer is still refused."""
    # Held in the middle of a minute: the minute's tokens are not given back during the test.
    clock = Clock(time.time() // 60 * 60 + 30)
    gateway: Gateway = await start_gateway(cache="memory", clocks=Clocks(wall=clock))
    # The request's worst case is 18 tokens (hi + max_tokens 10); the fake's answer uses 6.
    key = await gateway.create_key(tokens_per_minute=20)
    async with gateway.client(key) as client:

        async def ask(content: str) -> str:
            raw = await client.chat.completions.with_raw_response.create(
                model="qwen3-5-9b",
                messages=[{"role": "user", "content": content}],
                max_tokens=10,
            )
            return str(raw.headers["x-llmgw-cache"])

        assert await ask("hi") == "miss"  # 6 of the minute's 20 tokens used: 14 < 18 left
        assert [await ask("hi") for _ in range(3)] == ["hit"] * 3
        with pytest.raises(openai.RateLimitError, match="tokens per minute"):
            await ask("ho")


async def test_the_span_says_hit_or_miss_and_lookups_are_counted(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    key = await gateway.create_key()
    await _chat(gateway, key)
    await _chat(gateway, key)
    spans = [
        s
        for s in gateway.telemetry.spans.get_finished_spans()
        if "llmgw.cache.result" in s.attributes
    ]
    assert [s.attributes["llmgw.cache.result"] for s in spans] == ["miss", "hit"]
    data = gateway.telemetry.metrics.get_metrics_data()
    counted = {
        m.name: {p.attributes.get("llmgw.cache.result"): p.value for p in m.data.data_points}
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name.startswith("llmgw.cache.")
    }
    assert counted["llmgw.cache.lookups"] == {"miss": 1, "hit": 1}
    assert counted["llmgw.cache.bytes"][None] > 0


async def test_the_cache_is_off_by_default(gateway: Gateway, api_key: str) -> None:
    headers, _ = await _chat(gateway, api_key)
    assert "x-llmgw-cache" not in headers


async def test_a_tool_call_is_the_same_from_a_stored_stream(cached: Gateway) -> None:
    cached.fake.tool_call = ("get_weather", '{"city": "Paris"}')
    key = await cached.create_key()
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object"}},
        }
    ]
    async with cached.client(key) as client:
        stream = await client.chat.completions.create(
            model="qwen3-5-9b",
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=tools,  # type: ignore[arg-type]
            stream=True,
        )
        arguments, name, finish = "", "", None
        async for chunk in stream:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or ():
                    name += (call.function and call.function.name) or ""
                    arguments += (call.function and call.function.arguments) or ""
                finish = choice.finish_reason or finish

        async def as_json() -> tuple[str, Any]:
            raw = await client.chat.completions.with_raw_response.create(
                model="qwen3-5-9b",
                messages=MESSAGES,  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
            )
            return raw.headers["x-llmgw-cache"], raw.parse()

        _, answer = await eventually_hit(as_json)
    (call,) = answer.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (name, arguments) != ("", "")
    assert answer.choices[0].finish_reason == finish == "tool_calls"


async def test_a_stream_its_caller_left_is_not_stored(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    key = await gateway.create_key()
    await gateway.hang_up_mid_stream(key)
    await eventually(lambda: gateway.fake.cancelled_streams == 1)
    headers, _ = await _chat(gateway, key)
    assert headers["x-llmgw-cache"] == "miss"


async def test_the_team_scope_shares_within_a_team_only(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory", cache_scope="team")
    one = await teams.create_team(gateway.db, teams.TeamSettings(name="one"))
    two = await teams.create_team(gateway.db, teams.TeamSettings(name="two"))
    first = await gateway.create_key(team_id=one.id)
    mate, stranger = (
        await gateway.create_key(team_id=one.id),
        await gateway.create_key(team_id=two.id),
    )
    alone = await gateway.create_key()
    assert (await _chat(gateway, first))[0]["x-llmgw-cache"] == "miss"
    assert (await _chat(gateway, mate))[0]["x-llmgw-cache"] == "hit"
    assert (await _chat(gateway, stranger))[0]["x-llmgw-cache"] == "miss"
    assert (await _chat(gateway, alone))[0]["x-llmgw-cache"] == "miss"  # no team: its own
    assert (await _chat(gateway, alone))[0]["x-llmgw-cache"] == "hit"
    assert len(gateway.fake.chats()) == 3


async def test_a_key_never_follows_another_keys_request_in_flight(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    owner, other = await gateway.create_key(), await gateway.create_key()
    gateway.fake.enqueue(Behaviour(delay_before_headers=0.3))
    (first, _), (second, _) = await asyncio.gather(_chat(gateway, owner), _chat(gateway, other))
    assert first["x-llmgw-cache"] == second["x-llmgw-cache"] == "miss"
    assert len(gateway.fake.chats()) == 2


async def test_a_revoked_key_gets_no_hit(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    key = await gateway.create_key()
    await _chat(gateway, key)
    await api_keys.revoke_key(gateway.db, key)

    async def refused() -> bool:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gateway.url("/v1/chat/completions"),
                json={"model": "qwen3-5-9b", "messages": MESSAGES},
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                return response.status == 401 and "X-LLMGW-Cache" not in response.headers

    await eventually(refused)


async def test_embeddings_repeat_as_a_hit(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    key = await gateway.create_key()
    async with gateway.client(key) as client:
        for expected in ("miss", "hit"):
            raw = await client.embeddings.with_raw_response.create(
                model="text-embedding-qwen3-0-6b", input=["the quick brown fox"]
            )
            assert raw.headers["x-llmgw-cache"] == expected
            assert raw.parse().data[0].embedding


async def test_the_cli_clears_through_the_admin_api(start_gateway: Any) -> None:
    token = "b" * 32
    gateway: Gateway = await start_gateway(cache="memory", admin_token=token)
    key = await gateway.create_key()
    await _chat(gateway, key)
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmgw", "cache", "clear", "--url", gateway.url("/")],
        env=clean_env(LLMGW_ADMIN_TOKEN=token),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "deleted 1 cached answers" in result.stdout
    audit = await gateway.db.fetchval(
        "SELECT count(*) FROM admin_audit WHERE action = 'cache.clear'"
    )
    assert audit >= 1


async def test_the_callers_ttl_max_age_and_age_through_the_gateway(start_gateway: Any) -> None:
    clock = Clock(time.time())
    gateway: Gateway = await start_gateway(cache="memory", clocks=Clocks(wall=clock))
    key = await gateway.create_key()
    headers, _ = await _chat(gateway, key, **{"X-LLMGW-Cache-TTL": "10"})
    assert headers["x-llmgw-cache"] == "miss"
    clock.now += 5
    headers, _ = await _chat(gateway, key)
    assert (headers["x-llmgw-cache"], headers["age"]) == ("hit", "5")
    headers, _ = await _chat(gateway, key, **{"Cache-Control": "max-age=4"})
    assert headers["x-llmgw-cache"] == "miss"  # and stored again, for the default hour
    clock.now += 11
    headers, _ = await _chat(gateway, key)
    assert (headers["x-llmgw-cache"], headers["age"]) == ("hit", "11")
    assert len(gateway.fake.chats()) == 2


async def test_a_streamed_follower_gets_events_as_they_arrive(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(cache="memory")
    key = await gateway.create_key()
    hold = asyncio.Event()  # the upstream stream stops before its third chunk until set
    gateway.fake.enqueue(Behaviour(hold=hold, held_at=2))
    body = {"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True}
    auth = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session, asyncio.timeout(20):
        leader = await session.post(gateway.url("/v1/chat/completions"), json=body, headers=auth)
        await leader.content.readline()  # the leader's stream has begun
        follower = await session.post(gateway.url("/v1/chat/completions"), json=body, headers=auth)
        assert follower.headers["X-LLMGW-Cache"] == "hit"
        first = await follower.content.readline()
        assert first.startswith(b"data: {")
        assert gateway.fake.completed_streams == 0  # the leader's answer is still coming
        hold.set()
        rest = await follower.read()
        whole = await leader.read()
    assert rest.endswith(b"data: [DONE]\n\n") and whole.endswith(b"data: [DONE]\n\n")
    assert len(gateway.fake.chats()) == 1


async def test_the_cli_clears_a_redis_cache_itself(start_gateway: Any, database_url: str) -> None:
    if not REDIS_URL:
        pytest.skip("set LLMGW_TEST_REDIS_URL to test Redis")
    gateway: Gateway = await start_gateway(cache="redis", redis_url=REDIS_URL)
    key = await gateway.create_key()
    await _chat(gateway, key)
    await _stored(gateway, key)
    key_id = await gateway.db.fetchval("SELECT id FROM api_keys WHERE prefix = $1", key_prefix(key))
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmgw", "cache", "clear", "--key-id", str(key_id)],
        env=clean_env(LLMGW_CACHE="redis", REDIS_URL=REDIS_URL, DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "deleted 1 cached answers" in result.stdout
    headers, _ = await _chat(gateway, key)
    assert headers["x-llmgw-cache"] == "miss"
    assert await gateway.db.fetchval(
        "SELECT count(*) FROM admin_audit WHERE action = 'cache.clear' AND target = $1",
        str(key_id),
    )


async def test_an_alias_with_the_cache_off_is_a_bypass(start_gateway: Any) -> None:
    private = ModelAlias("private", (DeploymentSpec("venice", "qwen3-5-9b"),), cache=False)
    gateway: Gateway = await start_gateway(cache="memory", model_aliases=(private,))
    key = await gateway.create_key()
    async with gateway.client(key) as client:
        for _ in range(2):
            raw = await client.chat.completions.with_raw_response.create(
                model="private",
                messages=MESSAGES,  # type: ignore[arg-type]
            )
            assert raw.headers["x-llmgw-cache"] == "bypass"
    assert len(gateway.fake.chats()) == 2


async def test_a_reload_turns_an_aliases_cache_off(
    start_gateway: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    aliased = ModelAlias("aliased", (DeploymentSpec("venice", "qwen3-5-9b"),))
    gateway: Gateway = await start_gateway(cache="memory", model_aliases=(aliased,))
    key = await gateway.create_key()

    async def cached_as() -> str:
        async with gateway.client(key) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="aliased",
                messages=MESSAGES,  # type: ignore[arg-type]
            )
            return str(raw.headers["x-llmgw-cache"])

    assert await cached_as() == "miss"
    assert await cached_as() == "hit"
    config = tmp_path / "llmgw.toml"
    config.write_text(
        f'[[providers]]\nname = "venice"\nkind = "venice"\nbase_url = "{gateway.fake.base_url}"\n'
        'api_key_env = "VENICE_API_KEY"\n'
        '[[models]]\nalias = "aliased"\ndeployments = ["venice:qwen3-5-9b"]\ncache = false\n'
    )
    monkeypatch.setenv("LLMGW_CONFIG", str(config))
    monkeypatch.setenv("VENICE_API_KEY", FAKE_VENICE_KEY)
    monkeypatch.setenv("LLMGW_CACHE", "memory")
    assert await gateway.server.app[RELOADER].reload() is True
    assert await cached_as() == "bypass"
    assert len(gateway.fake.chats()) == 2
