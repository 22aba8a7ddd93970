"""``kind = "anthropic"`` end to end: the official SDKs through a real gateway to the fake Anthropic
(tests/fake_anthropic.py) and the fake Venice, over real sockets.

Messages callers on an Anthropic route are forwarded byte for byte and get the provider's events
unchanged; chat and Responses callers are translated; an alias falls back across kinds both ways.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx2
import openai
import pytest

from llmgw import app_keys
from llmgw.config import load_settings
from llmgw.routing.breaker import FAILURES_TO_OPEN
from tests.conftest import Gateway
from tests.fake_anthropic import (
    CACHE_CREATION,
    CACHE_CREATION_1H,
    CACHE_READ,
    FAKE_ANTHROPIC_KEY,
    THINKING,
    FakeAnthropic,
    input_tokens,
    signature,
)
from tests.fake_openai import providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.test_messages import ADD_TOOL

CLAUDE = "claude-sonnet-4-5"
VENICE = "qwen3-5-9b"
HELLO = [{"role": "user", "content": "Say hello"}]
RECORDED = json.loads((Path(__file__).parent / "data" / "claude_code_request.json").read_text())


@pytest.fixture
async def fake_anthropic() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as fake:
        yield fake


def config(anthropic_url: str, venice_url: str, *, claude_retries: int = 2) -> str:
    return f"""
[[providers]]
name = "claude"
kind = "anthropic"
base_url = "{anthropic_url}"
api_key_env = "ANTHROPIC_KEY"
max_retries = {claude_retries}

[[providers]]
name = "venice"
kind = "venice"
base_url = "{venice_url}"
api_key_env = "VENICE_API_KEY"
max_retries = 0

[[models]]
alias = "sonnet"
deployments = ["claude:{CLAUDE}"]

[[models]]
alias = "venice-then-claude"
deployments = ["venice:{VENICE}", "claude:{CLAUDE}"]

[[models]]
alias = "claude-then-venice"
deployments = ["claude:{CLAUDE}", "venice:{VENICE}"]
"""


@pytest.fixture
async def gateway(
    start_gateway: Any, fake_anthropic: FakeAnthropic, fake_venice: FakeVenice, tmp_path: Path
) -> Gateway:
    toml = config(fake_anthropic.base_url, fake_venice.base_url)
    keys = {"ANTHROPIC_KEY": FAKE_ANTHROPIC_KEY, "VENICE_API_KEY": FAKE_VENICE_KEY}
    started: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **keys))
    return started


class Sent:
    """What an SDK put on the wire: each request's body, byte for byte."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []

    async def __call__(self, request: httpx2.Request) -> None:
        self.bodies.append(await request.aread())
        self.headers.append({name.lower(): value for name, value in request.headers.items()})


def recording_client(gateway: Gateway, key: str) -> tuple[anthropic.AsyncAnthropic, Sent]:
    sent = Sent()
    http = httpx2.AsyncClient(event_hooks={"request": [sent]})
    client = gateway.anthropic_client(key, http_client=http)
    return client, sent


# Native Messages ---------------------------------------------------------------------------------


async def test_sdk_message_reaches_anthropic_byte_for_byte_and_comes_back_unchanged(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    key = await gateway.create_key(name="native")
    client, sent = recording_client(gateway, key)
    message = await client.messages.create(
        model=CLAUDE,
        max_tokens=256,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=HELLO,
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )
    (received,) = fake_anthropic.calls("/v1/messages")
    assert received.body == sent.bodies[-1]
    assert received.headers["x-api-key"] == FAKE_ANTHROPIC_KEY
    assert key not in json.dumps(received.headers)
    # The caller's version, not the adapter's default: it says how to read the body.
    assert received.headers["anthropic-version"] == sent.headers[-1]["anthropic-version"]
    assert received.headers["anthropic-beta"] == "prompt-caching-2024-07-31"
    assert message.content[0].text == "Hello from fake Claude!"  # type: ignore[union-attr]
    assert message.usage.cache_read_input_tokens == CACHE_READ
    (row,) = await gateway.ledger_rows(1)
    all_input = input_tokens(received.json) + CACHE_READ + CACHE_CREATION
    assert (row["provider"], row["input_tokens"]) == ("claude", all_input)
    assert row["output_tokens"] == message.usage.output_tokens
    counts = ("cache_read_input_tokens", "cache_creation_input_tokens")
    assert [row[c] for c in counts] == [CACHE_READ, CACHE_CREATION]
    assert row["cache_creation_1h_input_tokens"] == CACHE_CREATION_1H
    attributes = gateway.telemetry.span(f"chat {CLAUDE}").attributes
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == CACHE_READ
    assert attributes["gen_ai.usage.cache_creation.input_tokens"] == CACHE_CREATION


async def test_stream_events_come_back_unchanged_with_thinking_and_tools_over_turns(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    key = await gateway.create_key(name="native-stream")
    client, sent = recording_client(gateway, key)
    ask: dict[str, Any] = {
        "model": CLAUDE,
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "tools": [ADD_TOOL],
    }
    history: list[Any] = [{"role": "user", "content": "What is 4 + 6?"}]
    async with client.messages.stream(**ask, messages=history) as stream:
        first = await stream.get_final_message()
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0].signature == signature(THINKING)  # type: ignore[union-attr]
    tool_use = first.content[1]
    history += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "10"}],  # type: ignore[union-attr]
        },
    ]
    # The fake refuses a thinking block whose signature is not the one it issued.
    second = await client.messages.create(**ask, messages=history)
    assert [b.type for b in second.content] == ["thinking", "text"]
    bodies = [r.body for r in fake_anthropic.calls("/v1/messages")]
    assert bodies == sent.bodies
    # The raw stream, compared byte for byte with what the fake wrote.
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages"),
            json={**ask, "messages": history[:1], "stream": True},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        )
        relayed = await response.read()
    assert relayed == fake_anthropic.streamed[-1]
    rows = await gateway.ledger_rows(3)
    all_input = input_tokens(fake_anthropic.received[-1].json) + CACHE_READ + CACHE_CREATION
    four = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    assert [rows[-1][c] for c in four] == [all_input, CACHE_READ, CACHE_CREATION]
    assert rows[-1]["cache_creation_1h_input_tokens"] == CACHE_CREATION_1H
    assert rows[-1]["stream"] is True and rows[-1]["status"] == 200


async def test_an_alias_for_another_model_id_changes_only_the_model(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    client, sent = recording_client(gateway, await gateway.create_key(name="alias"))
    await client.messages.create(
        model="sonnet", max_tokens=64, messages=HELLO, metadata={"user_id": "u-1"}
    )
    received = fake_anthropic.received[-1].json
    assert received == {**json.loads(sent.bodies[-1]), "model": CLAUDE}
    assert list(received) == list(json.loads(sent.bodies[-1]))  # in the caller's order


async def test_recorded_claude_code_request_is_forwarded_as_sent(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    key = await gateway.create_key(name="claude-code")
    body = json.dumps({**RECORDED["body"], "model": CLAUDE}, indent=1).encode()
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url(RECORDED["path"]),
            data=body,
            headers={**RECORDED["headers"], "Content-Type": "application/json", "x-api-key": key},
        )
        relayed = await response.read()
    assert response.status == 200, relayed
    (received,) = fake_anthropic.calls("/v1/messages")
    assert received.body == body
    assert received.headers["anthropic-beta"] == RECORDED["headers"]["anthropic-beta"]
    assert "anthropic-dangerous-direct-browser-access" not in received.headers
    assert relayed == fake_anthropic.streamed[-1]


async def test_count_tokens_asks_anthropic_and_models_lists_its_models(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    client = gateway.anthropic_client(await gateway.create_key(name="count"))
    counted = await client.messages.count_tokens(model=CLAUDE, messages=HELLO)  # type: ignore[arg-type]
    (received,) = fake_anthropic.calls("/v1/messages/count_tokens")
    assert counted.input_tokens == input_tokens(received.json)
    # It reached a provider: one ledger row, which bills nothing (counting is free).
    (row,) = await gateway.ledger_rows(1)
    assert (row["operation"], row["status"], row["deployment"]) == (
        "count_tokens",
        200,
        f"claude:{CLAUDE}",
    )
    assert (row["input_tokens"], row["output_tokens"], row["cost_usd"]) == (0, 0, 0)
    models = await gateway.client(await gateway.create_key(name="models")).models.list()
    assert {CLAUDE, "claude-haiku-4-5"} <= {m.id for m in models.data}


async def test_count_tokens_refuses_a_model_outside_the_keys_allowed_models(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    """Issue 34 item 3: the same policy as /v1/messages, before anything is asked upstream."""
    key = await gateway.create_key(name="single", allowed_models=["venice-then-claude"])
    client = gateway.anthropic_client(key)
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        await client.messages.count_tokens(model="sonnet", messages=HELLO)  # type: ignore[arg-type]
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "permission_error"
    with pytest.raises(anthropic.PermissionDeniedError):
        await client.messages.create(model="sonnet", max_tokens=64, messages=HELLO)  # type: ignore[arg-type]
    # Allowed: counted by the gateway's estimate (not every deployment of it speaks Messages).
    counted = await client.messages.count_tokens(model="venice-then-claude", messages=HELLO)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    assert fake_anthropic.received == [], "Anthropic was asked with the gateway's key"


async def test_count_tokens_429s_do_not_open_the_messages_breaker(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    client = gateway.anthropic_client(await gateway.create_key(name="counting"))
    fake_anthropic.fail_counts_next(*[429] * 30)
    for _ in range(FAILURES_TO_OPEN + 1):
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.count_tokens(model="sonnet", messages=HELLO)  # type: ignore[arg-type]
    health = gateway.server.app[app_keys.PROVIDERS].routing.health(f"claude:{CLAUDE}")
    assert (health.state, health.consecutive_failures) == ("closed", 0)
    rows = await gateway.ledger_rows(FAILURES_TO_OPEN + 1)
    assert {(r["operation"], r["status"], r["error_type"]) for r in rows} == {
        ("count_tokens", 429, "429")
    }
    message = await client.messages.create(model="sonnet", max_tokens=64, messages=HELLO)  # type: ignore[arg-type]
    assert message.content[0].text == "Hello from fake Claude!"  # type: ignore[union-attr]


async def test_overloaded_is_retried_and_an_anthropic_error_keeps_its_shape(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    key = await gateway.create_key(name="errors")
    client = gateway.anthropic_client(key)
    fake_anthropic.fail_next(529)
    message = await client.messages.create(model=CLAUDE, max_tokens=64, messages=HELLO)
    assert message.content[0].text == "Hello from fake Claude!"  # type: ignore[union-attr]
    assert len(fake_anthropic.calls("/v1/messages")) == 2
    fake_anthropic.fail_next(429, 429, 429)  # the first answer and both retries
    with pytest.raises(anthropic.RateLimitError) as refused:
        await client.messages.create(model=CLAUDE, max_tokens=64, messages=HELLO)
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    fake_anthropic.fail_next(429, 429, 429)
    with pytest.raises(openai.RateLimitError) as chat_refused:
        await gateway.client(key).chat.completions.create(model=CLAUDE, messages=HELLO)  # type: ignore[arg-type]
    assert "per-minute rate limit" in chat_refused.value.message
    assert chat_refused.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    # What Anthropic's API has not: refused before anything is sent, in the caller's shape.
    with pytest.raises(openai.BadRequestError) as no_embeddings:
        await gateway.client(key).embeddings.create(model=CLAUDE, input="hi")
    assert "Anthropic's Messages API, which has no /embeddings" in no_embeddings.value.message
    assert not fake_anthropic.calls("/v1/embeddings")


# Chat and Responses callers, translated -----------------------------------------------------------


async def test_openai_sdk_chat_plain_and_stream_reach_anthropic_translated(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    client = gateway.client(await gateway.create_key(name="chat"))
    completion = await client.chat.completions.create(
        model=CLAUDE,
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],  # type: ignore[list-item]
        stop=["END"],
        reasoning_effort="low",
    )
    sent = fake_anthropic.received[-1]
    assert sent.json == {
        "model": CLAUDE,
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": HELLO,
        "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }
    assert sent.headers["x-api-key"] == FAKE_ANTHROPIC_KEY
    choice = completion.choices[0]
    assert (choice.message.content, choice.finish_reason) == ("Hello from fake Claude!", "stop")
    assert choice.message.reasoning_content == THINKING  # type: ignore[attr-defined]
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == input_tokens(sent.json) + CACHE_READ + CACHE_CREATION
    assert completion.usage.prompt_tokens_details.cached_tokens == CACHE_READ  # type: ignore[union-attr]
    stream = await client.chat.completions.create(
        model=CLAUDE, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from fake Claude!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == (
        input_tokens(fake_anthropic.received[-1].json) + CACHE_READ + CACHE_CREATION
    )
    rows = await gateway.ledger_rows(2)
    assert rows[-1]["input_tokens"] == chunks[-1].usage.prompt_tokens
    # The 1-hour cache writes reach the ledger through the chat translation too.
    assert rows[-1]["cache_creation_1h_input_tokens"] == CACHE_CREATION_1H


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_tools_over_two_turns(
    gateway: Gateway, fake_anthropic: FakeAnthropic, stream: bool
) -> None:
    client = gateway.client(await gateway.create_key(name="tools"))
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": ADD_TOOL["input_schema"],
            },
        }
    ]
    messages: list[Any] = [{"role": "user", "content": "What is 4 + 6?"}]
    if stream:
        chunks = await client.chat.completions.create(
            model=CLAUDE, messages=messages, tools=tools, stream=True
        )
        calls: dict[int, dict[str, str]] = {}
        async for chunk in chunks:
            for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.id or ""
                entry["name"] += (call.function and call.function.name) or ""
                entry["arguments"] += (call.function and call.function.arguments) or ""
        (call_id, name, arguments) = calls[0].values()
    else:
        completion = await client.chat.completions.create(
            model=CLAUDE, messages=messages, tools=tools
        )
        assert completion.choices[0].finish_reason == "tool_calls"
        tool_call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
        call_id, name, arguments = (
            tool_call.id,
            tool_call.function.name,
            tool_call.function.arguments,
        )  # type: ignore[union-attr]
    assert (name, json.loads(arguments)) == ("add", {"a": 4, "b": 6})
    assert fake_anthropic.received[-1].json["tools"] == [ADD_TOOL]
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "10"},
    ]
    answer = await client.chat.completions.create(model=CLAUDE, messages=messages, tools=tools)
    assert answer.choices[0].message.content == "Hello from fake Claude!"
    assert fake_anthropic.received[-1].json["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call_id, "name": "add", "input": {"a": 4, "b": 6}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "10"}],
        },
    ]


async def test_openai_sdk_responses_is_translated_to_anthropic(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    client = gateway.client(await gateway.create_key(name="responses"))
    response = await client.responses.create(
        model=CLAUDE, input="Say hello", instructions="Be brief."
    )
    assert response.output_text == "Hello from fake Claude!"
    sent = fake_anthropic.received[-1].json
    assert (sent["system"], sent["messages"]) == ("Be brief.", HELLO)
    events = [
        e.type
        async for e in await client.responses.create(model=CLAUDE, input="Say hello", stream=True)
    ]
    assert events[-1] == "response.completed"


# Routing across kinds ------------------------------------------------------------------------------


async def test_an_alias_falls_back_from_venice_to_anthropic(
    gateway: Gateway, fake_anthropic: FakeAnthropic, fake_venice: FakeVenice
) -> None:
    key = await gateway.create_key(name="fallback")
    fake_venice.enqueue(Behaviour(status=503))
    completion = await gateway.client(key).chat.completions.create(
        model="venice-then-claude",
        messages=HELLO,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == "Hello from fake Claude!"
    assert fake_anthropic.received[-1].json["model"] == CLAUDE
    # A Messages caller on a route that mixes kinds is translated, whichever deployment answers.
    fake_venice.enqueue(Behaviour(status=503))
    message = await gateway.anthropic_client(key).messages.create(
        model="venice-then-claude",
        max_tokens=64,
        messages=HELLO,  # type: ignore[arg-type]
    )
    assert message.content[0].text == "Hello from fake Claude!"  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_alias_falls_back_from_anthropic_to_venice(
    start_gateway: Any,
    fake_anthropic: FakeAnthropic,
    fake_venice: FakeVenice,
    tmp_path: Path,
    stream: bool,
) -> None:
    toml = config(fake_anthropic.base_url, fake_venice.base_url, claude_retries=0)
    keys = {"ANTHROPIC_KEY": FAKE_ANTHROPIC_KEY, "VENICE_API_KEY": FAKE_VENICE_KEY}
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **keys))
    client = gateway.anthropic_client(await gateway.create_key(name="fallback"))
    fake_anthropic.fail_next(529)
    if stream:
        async with client.messages.stream(
            model="claude-then-venice",
            max_tokens=64,
            messages=HELLO,  # type: ignore[arg-type]
        ) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(
            model="claude-then-venice",
            max_tokens=64,
            messages=HELLO,  # type: ignore[arg-type]
        )
    assert message.content[0].text == "Hello from fake Venice!"  # type: ignore[union-attr]
    assert len(fake_anthropic.calls("/v1/messages")) == 1
    assert fake_venice.received[-1].json["model"] == VENICE


async def test_a_broken_venice_stream_is_finished_by_anthropic_continuing_the_text(
    gateway: Gateway, fake_anthropic: FakeAnthropic, fake_venice: FakeVenice
) -> None:
    # Five chunks of two words each: the text relayed before the break ends in a space, which
    # Anthropic refuses in a prefill; it is trimmed, and the continuation's own space dropped.
    fake_anthropic.reply = fake_venice.reply = "one two six ten red tan fox owl cat dog."
    fake_venice.enqueue(Behaviour(drop_after_chunks=3))
    client = gateway.client(await gateway.create_key(name="continuation"))
    chunks = await client.chat.completions.create(
        model="venice-then-claude",
        messages=HELLO,
        stream=True,  # type: ignore[arg-type]
    )
    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    assert text == fake_venice.reply
    continued = fake_anthropic.received[-1].json["messages"]
    assert continued[:-1] == HELLO
    prefill = continued[-1]
    assert prefill["role"] == "assistant" and fake_venice.reply.startswith(prefill["content"])
    assert prefill["content"].endswith(("two", "ten", "tan", "owl"))


async def test_an_error_event_mid_stream_reaches_a_messages_caller_as_anthropic_sent_it(
    gateway: Gateway, fake_anthropic: FakeAnthropic
) -> None:
    key = await gateway.create_key(name="stream-error")
    fake_anthropic.error_mid_stream()
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages"),
            json={"model": CLAUDE, "max_tokens": 64, "messages": HELLO, "stream": True},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        )
        relayed = await response.read()
    assert relayed == fake_anthropic.streamed[-1]
    assert relayed.endswith(b'"error":{"type":"overloaded_error","message":"Overloaded"}}\n\n')
    (row,) = await gateway.ledger_rows(1)
    assert row["error_type"] == "upstream_stream_error"  # the answer is not whole


# Cost --------------------------------------------------------------------------------------------

CLAUDE_PRICES = f"""
[[prices]]
model = "claude:{CLAUDE}"
input_usd_per_mtok = 3
output_usd_per_mtok = 15
cache_read_usd_per_mtok = 0.3
cache_write_usd_per_mtok = 3.75
cache_write_1h_usd_per_mtok = 6
"""


def claude_bill(fresh_input: int, output: int) -> Decimal:
    """By hand, from what the fake Anthropic reports: besides the fresh input and the output,
    its cache reads and its 5-minute and 1-hour cache writes, each at its own price."""
    return (
        fresh_input * Decimal(3)
        + CACHE_READ * Decimal("0.3")
        + (CACHE_CREATION - CACHE_CREATION_1H) * Decimal("3.75")
        + CACHE_CREATION_1H * Decimal(6)
        + output * Decimal(15)
    ) / 1_000_000


async def test_anthropic_answers_are_billed_at_their_configured_prices_exactly(
    start_gateway: Any, fake_anthropic: FakeAnthropic, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(config(fake_anthropic.base_url, fake_venice.base_url) + CLAUDE_PRICES)
    keys = {"ANTHROPIC_KEY": FAKE_ANTHROPIC_KEY, "VENICE_API_KEY": FAKE_VENICE_KEY}
    settings = load_settings({"LLMGW_CONFIG": str(path), **keys})
    gateway: Gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases, prices=settings.prices
    )
    key = await gateway.create_key(name="priced")
    client = gateway.anthropic_client(key)

    message = await client.messages.create(model=CLAUDE, max_tokens=256, messages=HELLO)
    async with client.messages.stream(model=CLAUDE, max_tokens=256, messages=HELLO) as stream:
        streamed = await stream.get_final_message()
    completion = await gateway.client(key).chat.completions.create(model=CLAUDE, messages=HELLO)

    # Anthropic's input_tokens are the fresh ones; chat's prompt_tokens count the cache too.
    assert completion.usage is not None
    chat_fresh = completion.usage.prompt_tokens - CACHE_READ - CACHE_CREATION
    rows = await gateway.ledger_rows(3)
    assert [row["cost_usd"] for row in rows] == [
        claude_bill(message.usage.input_tokens, message.usage.output_tokens),
        claude_bill(streamed.usage.input_tokens, streamed.usage.output_tokens),
        claude_bill(chat_fresh, completion.usage.completion_tokens),
    ]
    assert {row["cost_computed"] for row in rows} == {True}
