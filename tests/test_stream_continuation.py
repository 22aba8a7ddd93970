"""A stream that breaks after part of the answer reached the caller is finished on the route's next
deployment (or its only one again): the caller gets one whole answer, one finish, one end.

Real sockets throughout: the gateway in front of two fake Venices, one of which breaks on purpose.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from llmgw import app_keys
from llmgw.accounting.estimate import estimate_output_tokens
from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway
from tests.fake_openai import providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, TOOL_ARGUMENTS, Behaviour, FakeVenice

MODEL = "qwen3-5-9b"
MESSAGES = [{"role": "user", "content": "count for me"}]
# 60 words of 4 characters each with its space: the fake's 60 chunks are one word each.
WORDS = [f"w{index:02d} " for index in range(60)]
REPLY = "".join(WORDS).rstrip()
SENT = "".join(WORDS[:40])  # what the caller has when the first stream breaks after 40 words


def provider(name: str, venice: FakeVenice, *, prefill: bool) -> str:
    return (
        f'[[providers]]\nname = "{name}"\nkind = "venice"\nbase_url = "{venice.base_url}"\n'
        f'api_key_env = "VENICE_API_KEY"\nmax_retries = 0\nprefill = {str(prefill).lower()}\n\n'
    )


def alias(name: str, *deployments: str) -> str:
    quoted = ", ".join(f'"{d}:{MODEL}"' for d in deployments)
    return f'[[models]]\nalias = "{name}"\ndeployments = [{quoted}]\n\n'


@pytest.fixture
async def second() -> AsyncIterator[FakeVenice]:
    """The deployment that finishes the answer: it continues a prefill, as a prefill model does."""
    async with FakeVenice(reply=REPLY, chunks=60) as fake:
        fake.continues_prefill = True
        yield fake


@pytest.fixture
async def routes(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice, second: FakeVenice
) -> Gateway:
    """``first`` breaks; ``prefill`` (continues a prefill) and ``restart`` (does not) finish."""
    fake_venice.reply, fake_venice.chunks = REPLY, 60
    toml = provider("first", fake_venice, prefill=False)
    toml += provider("prefill", second, prefill=True)
    toml += provider("restart", second, prefill=False)
    toml += alias("pre", "first", "prefill") + alias("re", "first", "restart")
    toml += alias("alone", "first")
    settings = providers_settings(tmp_path, toml, VENICE_API_KEY=FAKE_VENICE_KEY)
    gateway: Gateway = await start_gateway(**settings)
    return gateway


@pytest.fixture
async def key(routes: Gateway) -> str:
    return await routes.create_key(name="continuation")


async def raw_stream(gateway: Gateway, key: str, model: str, **extra: Any) -> list[bytes]:
    """The data of every event the caller received, in order."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": model, "messages": MESSAGES, "stream": True, **extra},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        assert response.status == 200
        body = await response.read()
    return [event.removeprefix(b"data: ") for event in body.split(b"\n\n") if event]


def text_of(events: list[bytes]) -> str:
    chunks = [orjson.loads(data) for data in events if data != b"[DONE]"]
    return "".join(
        choice["delta"].get("content") or ""
        for chunk in chunks
        for choice in chunk.get("choices", [])
    )


def finishes(events: list[bytes]) -> list[str]:
    chunks = [orjson.loads(data) for data in events if data != b"[DONE]"]
    return [
        choice["finish_reason"]
        for chunk in chunks
        for choice in chunk.get("choices", [])
        if choice["finish_reason"] is not None
    ]


def assert_whole(events: list[bytes]) -> None:
    assert text_of(events) == REPLY
    assert finishes(events) == ["stop"]
    assert events[-1] == b"[DONE]"
    assert events.count(b"[DONE]") == 1


async def ledger_row(gateway: Gateway) -> Any:
    assert await gateway.server.app[app_keys.LEDGER].flush()
    rows = await gateway.db.fetch("SELECT * FROM usage_events ORDER BY id")
    assert len(rows) == 1, "one request, one row, however many attempts"
    return rows[0]


def chats(venice: FakeVenice) -> list[Any]:
    """The chat requests the fake was sent (the gateway also lists its models at start)."""
    return [r for r in venice.received if r.json is not None]


def continuation_events(gateway: Gateway, model: str) -> list[dict[str, Any]]:
    span = gateway.telemetry.span(f"chat {model}")
    return [
        dict(event.attributes)
        for event in span.events
        if event.name == sc.EVENT_STREAM_CONTINUATION
    ]


async def test_a_stream_cut_after_40_of_60_words_is_finished_by_a_prefill(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    events = await raw_stream(routes, key, "pre")
    assert_whole(events)
    prefilled = second.received[-1].json["messages"]
    assert prefilled == [*MESSAGES, {"role": "assistant", "content": SENT}]
    # The continuation is relayed without a second role.
    roles = [c["delta"].get("role") for e in events[:-1] for c in orjson.loads(e)["choices"]]
    assert [role for role in roles if role] == ["assistant"]
    row = await ledger_row(routes)
    # The deployment that finished the answer, and the two attempts whose tokens the row counts.
    assert (row["provider"], row["status"], row["error_type"]) == ("prefill", 200, None)
    assert (row["deployment"], row["attempts"]) == (f"prefill:{MODEL}", 2)
    # The broken attempt reported nothing: the row counts it as an estimate, flagged so.
    assert row["usage_source"] == "estimated"
    # The continuation reported its own (the fake counts a token per chunk: 60); the cut attempt
    # is estimated from the characters it produced.
    assert row["output_tokens"] == 60 + estimate_output_tokens(len(SENT))
    [event] = continuation_events(routes, "pre")
    assert event[sc.LLMGW_CONTINUATION_MODE] == "prefill"
    assert event[sc.LLMGW_CONTINUATION_SENT_CHARS] == len(SENT)
    assert event[sc.LLMGW_CONTINUATION_REASON] == "upstream_stream_interrupted"
    assert event[sc.LLMGW_DEPLOYMENT] == f"first:{MODEL}"
    assert event[sc.LLMGW_CONTINUATION_DEPLOYMENT] == f"prefill:{MODEL}"
    [counted] = routes.telemetry.metric_points(sc.METRIC_STREAM_CONTINUATIONS)
    assert (counted.value, counted.attributes[sc.LLMGW_CONTINUATION_OUTCOME]) == (1, "continued")
    span = dict(routes.telemetry.span("chat pre").attributes)
    assert span[sc.LLMGW_DEPLOYMENT] == f"prefill:{MODEL}"
    assert span[sc.LLMGW_DEPLOYMENTS_TRIED] == 2


async def test_a_restart_that_repeats_the_text_sent_is_relayed_from_where_the_caller_is(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    events = await raw_stream(routes, key, "re")
    assert_whole(events)
    assert second.received[-1].json["messages"] == MESSAGES, "no prefill without the capability"
    [event] = continuation_events(routes, "re")
    assert event[sc.LLMGW_CONTINUATION_MODE] == "restart"


async def test_a_restart_that_answers_differently_ends_with_an_in_band_error(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    second.enqueue(Behaviour(reply="Something else entirely, said another way."))
    events = await raw_stream(routes, key, "re")
    assert b"[DONE]" not in events
    error = orjson.loads(events[-1])["error"]
    assert error["code"] == "upstream_stream_interrupted"
    assert "began differently" in error["message"]
    assert text_of(events[:-1]) == SENT, "nothing of the other answer reaches the caller"
    assert finishes(events[:-1]) == []
    row = await ledger_row(routes)
    assert (row["status"], row["error_type"]) == (200, "upstream_stream_interrupted")


async def test_a_stream_broken_inside_a_tool_call_ends_with_an_in_band_error(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=3))
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    events = await raw_stream(routes, key, "pre", tools=tools)
    assert b"[DONE]" not in events
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_stream_interrupted"
    arguments = "".join(
        call["function"]["arguments"]
        for data in events[:-1]
        for choice in orjson.loads(data)["choices"]
        for call in choice["delta"].get("tool_calls") or []
    )
    assert arguments and TOOL_ARGUMENTS.startswith(arguments) and arguments != TOOL_ARGUMENTS
    assert chats(second) == [], "a tool call is never continued"
    [event] = continuation_events(routes, "pre")
    assert event[sc.LLMGW_CONTINUATION_OUTCOME] == "broke inside a tool call"


@pytest.mark.parametrize(
    "behaviour",
    [Behaviour(end_after_chunks=40), Behaviour(error_event_after_chunks=40)],
    ids=["no-done", "error-event"],
)
async def test_a_stream_that_ends_unfinished_or_with_an_error_event_is_finished(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice, behaviour: Behaviour
) -> None:
    fake_venice.enqueue(behaviour)
    events = await raw_stream(routes, key, "pre")
    assert_whole(events)
    assert b"overloaded" not in b"".join(events), "the error event is not relayed"
    assert second.received[-1].json["messages"][-1] == {"role": "assistant", "content": SENT}


async def test_the_only_deployment_finishes_its_own_answer(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    assert_whole(await raw_stream(routes, key, "alone"))
    assert len(chats(fake_venice)) == 2


async def test_when_the_continuation_breaks_too_the_caller_gets_the_failure(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(
        Behaviour(error_event_after_chunks=40), Behaviour(error_event_after_chunks=10)
    )
    events = await raw_stream(routes, key, "alone")
    assert b"[DONE]" not in events
    # The provider's own error event, as it sent it.
    assert orjson.loads(events[-1])["error"]["message"] == "The model is currently overloaded."
    assert text_of(events[:-1]) == SENT


async def test_a_refused_prefill_is_not_shown_in_place_of_the_real_failure(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    second.enqueue(Behaviour(status=400))
    events = await raw_stream(routes, key, "pre")
    error = orjson.loads(events[-1])["error"]
    assert error["code"] == "upstream_stream_interrupted"
    assert "broke off the stream" in error["message"]
    assert len(chats(second)) == 1
    row = await ledger_row(routes)
    assert (row["provider"], row["error_type"]) == ("first", "upstream_stream_interrupted")
    # Not finished: the row stays the broken deployment's; both attempts are counted and listed.
    assert (row["deployment"], row["attempts"]) == (f"first:{MODEL}", 2)
    [broke, refused] = orjson.loads(row["attempt_log"])
    assert (broke["deployment"], broke["ended"]) == (f"first:{MODEL}", "failed")
    assert broke["error"] == "upstream_stream_interrupted"
    assert (refused["deployment"], refused["ended"], refused["status"]) == (
        f"prefill:{MODEL}",
        "failed",
        400,
    )


async def test_a_malformed_event_is_dropped_counted_and_the_stream_goes_on(
    routes: Gateway, key: str, fake_venice: FakeVenice, caplog: pytest.LogCaptureFixture
) -> None:
    fake_venice.enqueue(Behaviour(garbage_after_chunks=5))
    events = await raw_stream(routes, key, "alone")
    assert_whole(events)
    assert b"not json" not in b"".join(events)
    assert len(chats(fake_venice)) == 1, "the stream went on: nothing to continue"
    span = dict(routes.telemetry.span("chat alone").attributes)
    assert span[sc.LLMGW_STREAM_MALFORMED_EVENTS] == 1
    [point] = routes.telemetry.metric_points(sc.METRIC_STREAM_MALFORMED_EVENTS)
    assert point.value == 1
    assert caplog.text.count("not JSON") == 1


async def test_a_malformed_event_in_a_translated_stream_is_dropped(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(garbage_after_chunks=5))
    client = routes.anthropic_client(key)
    async with client.messages.stream(model="alone", max_tokens=256, messages=MESSAGES) as stream:
        message = await stream.get_final_message()
    assert [block.text for block in message.content if block.type == "text"] == [REPLY]
    assert message.stop_reason == "end_turn"


# The official SDKs assemble the uninterrupted answer from a continued stream.


async def test_openai_sdk_chat_assembles_the_whole_answer(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    client = routes.client(key)
    async with client.chat.completions.stream(model="pre", messages=MESSAGES) as stream:
        completion = await stream.get_final_completion()
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"


async def test_openai_sdk_responses_assembles_the_whole_answer(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    client = routes.client(key)
    stream = await client.responses.create(model="pre", input="count for me", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == REPLY
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == REPLY


async def test_anthropic_sdk_messages_assembles_the_whole_answer(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    client = routes.anthropic_client(key)
    async with client.messages.stream(model="re", max_tokens=256, messages=MESSAGES) as stream:
        text = "".join([delta async for delta in stream.text_stream])
        message = await stream.get_final_message()
    assert text == REPLY
    assert message.stop_reason == "end_turn"
    assert isinstance(message, anthropic.types.Message)


# The same on a gateway with no providers file (Venice alone): no new setting involved.


async def test_venice_alone_finishes_a_stream_it_cut(gateway: Gateway, api_key: str) -> None:
    gateway.fake.reply, gateway.fake.chunks = REPLY, 60
    gateway.fake.enqueue(Behaviour(drop_after_chunks=40))
    assert_whole(await raw_stream(gateway, api_key, MODEL))
    assert [len(r.json["messages"]) for r in chats(gateway.fake)] == [1, 1]  # a restart


async def test_venice_alone_drops_a_malformed_event_and_goes_on(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.reply, gateway.fake.chunks = REPLY, 60
    gateway.fake.enqueue(Behaviour(garbage_after_chunks=20))
    events = await raw_stream(gateway, api_key, MODEL)
    assert_whole(events)
    assert len(chats(gateway.fake)) == 1


async def test_venice_alone_finishes_a_stream_it_left_silent(start_gateway: Any) -> None:
    gateway: Gateway = await start_gateway(request_timeout_seconds=1.0)
    key = await gateway.create_key(name="stall")
    gateway.fake.reply, gateway.fake.chunks = REPLY, 60
    gateway.fake.enqueue(Behaviour(stall_after_chunks=40))
    assert_whole(await raw_stream(gateway, key, MODEL))
    [event] = continuation_events(gateway, MODEL)
    assert event[sc.LLMGW_CONTINUATION_REASON] == "upstream_stream_timeout"


async def test_a_continued_stream_leaves_neither_deployment_counted_in_flight(
    routes: Gateway, key: str, fake_venice: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    assert_whole(await raw_stream(routes, key, "pre"))
    await ledger_row(routes)  # the request has finished
    routing = routes.server.app[app_keys.PROVIDERS].routing
    busy = {
        label: routing.health(label).in_flight for label in (f"first:{MODEL}", f"prefill:{MODEL}")
    }
    assert busy == {f"first:{MODEL}": 0, f"prefill:{MODEL}": 0}
    # The broken stream's deployment answered first: it is timed by its own first chunk.
    assert routing.health(f"first:{MODEL}").latency_seconds is not None


# A continuation spends what is left of the caller's output budget, and never goes back to a
# deployment that broke in the request while another is left (issue 34, item 5).


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_a_prefill_continuation_is_sent_what_is_left_of_the_budget(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice, field: str
) -> None:
    fake_venice.honours_max_tokens = second.honours_max_tokens = True
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    events = await raw_stream(routes, key, "pre", **{field: 50})
    spent = estimate_output_tokens(len(SENT))  # the 40 words the caller has: 40 tokens
    assert second.received[-1].json[field] == 50 - spent
    assert finishes(events) == ["length"]
    assert events[-1] == b"[DONE]"
    row = await ledger_row(routes)
    assert row["output_tokens"] == 50, "no more than the caller asked for"


async def test_a_messages_caller_s_max_tokens_bounds_the_continuation(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    second.honours_max_tokens = True
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    client = routes.anthropic_client(key)
    async with client.messages.stream(model="pre", max_tokens=45, messages=MESSAGES) as stream:
        message = await stream.get_final_message()
    assert second.received[-1].json["max_completion_tokens"] == 5
    assert message.stop_reason == "max_tokens"


async def test_a_stream_broken_with_the_budget_spent_ends_at_length_without_continuing(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    events = await raw_stream(routes, key, "pre", max_tokens=40)
    assert text_of(events) == SENT
    assert finishes(events) == ["length"]
    assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
    assert chats(second) == [], "nothing is left to ask for"
    row = await ledger_row(routes)
    assert (row["status"], row["error_type"]) == (200, None)
    assert (row["deployment"], row["attempts"]) == (f"first:{MODEL}", 1)


async def test_a_messages_stream_broken_with_the_budget_spent_stops_at_max_tokens(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    client = routes.anthropic_client(key)
    async with client.messages.stream(model="pre", max_tokens=40, messages=MESSAGES) as stream:
        message = await stream.get_final_message()
    assert [block.text for block in message.content if block.type == "text"] == [SENT]
    assert message.stop_reason == "max_tokens"
    assert chats(second) == []


async def test_a_restart_is_sent_the_whole_budget_it_spends_again(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    await raw_stream(routes, key, "re", max_tokens=500)
    assert second.received[-1].json["max_tokens"] == 500


async def test_a_continuation_never_goes_back_to_the_deployment_that_broke(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    second.enqueue(Behaviour(drop_after_chunks=5))
    events = await raw_stream(routes, key, "pre")
    assert b"[DONE]" not in events
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_stream_interrupted"
    assert len(chats(fake_venice)) == 1, "the first deployment broke: it is not asked again"
    assert len(chats(second)) == 1
    row = await ledger_row(routes)
    assert row["attempts"] == 2


def tokens_reserved_now(gateway: Gateway, key_id: Any) -> Any:
    limits = gateway.server.app[app_keys.LIMITS]
    minute = int(limits._clock() // 60 * 60)
    return limits.store.usage(f"tokens:{key_id}:{minute}")


async def worst_case_of(gateway: Gateway, max_tokens: int) -> int:
    limits = gateway.server.app[app_keys.LIMITS]
    worst = limits.worst_case(
        {"model": "re", "messages": MESSAGES, "max_tokens": max_tokens},
        [],
        produces_output=True,
        priced=False,
        model="re",
    )
    return int(worst.input_tokens + worst.output_tokens)


# The admission covers what a continuation can add to the bill: the prompt sent again, and the
# output it may still produce (issue 34, item 5).


async def test_a_continuation_the_key_s_limit_cannot_cover_is_not_sent(
    routes: Gateway, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    worst = await worst_case_of(routes, 500)
    key = await routes.create_key(name="tight", tokens_per_minute=worst + 100)
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    events = await raw_stream(routes, key, "re", max_tokens=500)
    assert text_of(events) == SENT
    assert b"[DONE]" not in events
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_stream_interrupted"
    assert chats(second) == [], "a restart of 500 more tokens does not fit the key's minute"
    row = await ledger_row(routes)
    assert row["attempts"] == 1
    assert row["input_tokens"] + row["output_tokens"] <= worst + 100


async def test_a_continuation_within_the_limit_is_reserved_and_given_back_at_the_end(
    routes: Gateway, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    worst = await worst_case_of(routes, 500)
    key = await routes.create_key(name="roomy", tokens_per_minute=worst * 3)
    key_id = (await routes.db.fetchrow("SELECT id FROM api_keys WHERE name = 'roomy'"))["id"]
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    events = await raw_stream(routes, key, "re", max_tokens=500)
    assert_whole(events)
    assert len(chats(second)) == 1
    row = await ledger_row(routes)
    assert row["attempts"] == 2
    assert await routes.server.app[app_keys.LIMITS].flush()
    used, reserved = await tokens_reserved_now(routes, key_id)
    assert reserved == 0, "what the continuation reserved is given back at the end"
    assert used == row["input_tokens"] + row["output_tokens"]


async def test_a_responses_stream_broken_with_the_budget_spent_ends_incomplete(
    routes: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    client = routes.client(key)
    stream = await client.responses.create(
        model="pre", input="count for me", stream=True, max_output_tokens=40
    )
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == SENT
    assert chats(second) == []
