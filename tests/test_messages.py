"""POST /v1/messages and /v1/messages/count_tokens through the official anthropic SDK, against the
fake Venice: what Venice is sent, what the SDK gets back, and every error as the SDK's own class."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from tests.conftest import Gateway, eventually
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, count_prompt_tokens

MODEL = "qwen3-5-9b"
TOOL_MODEL = "mistral-small-3-2-24b-instruct"
HELLO = [{"role": "user", "content": "Say hello to the gateway tests"}]
ADD_TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n fake pixel").decode()


def sent(gateway: Gateway) -> dict[str, Any]:
    """The chat completions body Venice got for the last request."""
    body: dict[str, Any] = gateway.fake.received[-1].json
    return body


async def test_text_message_and_what_venice_is_sent(gateway: Gateway, api_key: str) -> None:
    client = gateway.anthropic_client(api_key)
    message = await client.messages.create(
        model=MODEL,
        max_tokens=256,
        messages=HELLO,
        stop_sequences=["END"],
        metadata={"user_id": "user-42"},
        # Sampling parameters left the SDK's signature in 2.x; Claude Code and older SDKs send them.
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40},
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello from fake Venice!"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.model == MODEL
    assert message.usage.input_tokens == count_prompt_tokens(HELLO)
    assert message.usage.output_tokens == 5
    assert message.usage.cache_read_input_tokens == 0
    assert sent(gateway) == {
        "model": MODEL,
        "messages": HELLO,
        "max_completion_tokens": 256,
        "stop": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "user": "user-42",
    }
    received = gateway.fake.received[-1]
    assert received.headers["authorization"] == f"Bearer {FAKE_VENICE_KEY}"
    assert api_key not in str(received.headers)


async def test_system_blocks_with_cache_control_and_images(gateway: Gateway, api_key: str) -> None:
    client = gateway.anthropic_client(api_key)
    message = await client.messages.create(
        model=MODEL,
        max_tokens=64,
        system=[
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Project rules.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What are these?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
                ],
            }
        ],
    )
    assert message.content[0].text == "Hello from fake Venice!"  # type: ignore[union-attr]
    assert sent(gateway)["messages"] == [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "You are terse."},
                {"type": "text", "text": "Project rules.", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What are these?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
            ],
        },
    ]


async def test_tool_use_then_tool_results_over_several_turns(
    gateway: Gateway, api_key: str
) -> None:
    client = gateway.anthropic_client(api_key)
    history: list[Any] = [{"role": "user", "content": "What is 4 + 6? Use the tool."}]
    first = await client.messages.create(
        model=TOOL_MODEL,
        max_tokens=128,
        tools=[ADD_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=history,
    )
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "add" and call.input == {"a": 4, "b": 6}
    venice_call_id = call.id
    assert sent(gateway)["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": ADD_TOOL["input_schema"],
            },
        }
    ]
    assert sent(gateway)["tool_choice"] == "required"
    assert sent(gateway)["parallel_tool_calls"] is False

    history += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "10"}],
        },
    ]
    second = await client.messages.create(
        model=TOOL_MODEL, max_tokens=128, tools=[ADD_TOOL], messages=history
    )
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "Hello from fake Venice!"  # type: ignore[union-attr]
    assert sent(gateway)["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": venice_call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a":4,"b":6}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": venice_call_id, "content": "10"},
    ]

    # A third turn: the tool failed this time, and the user adds a remark after the result.
    history += [
        {"role": "assistant", "content": second.content},
        {"role": "user", "content": "Now 1 + 1."},
        {"role": "assistant", "content": [{**call.model_dump(), "id": "toolu_2"}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "overflow"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Try again?"},
            ],
        },
    ]
    third = await client.messages.create(
        model=TOOL_MODEL, max_tokens=128, tools=[ADD_TOOL], messages=history
    )
    assert third.stop_reason == "tool_use"  # the last message is the user's, not a tool result
    assert sent(gateway)["messages"][-2:] == [
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: overflow"},
        {"role": "user", "content": [{"type": "text", "text": "Try again?"}]},
    ]


async def test_thinking_becomes_reasoning_effort_and_reasoning_comes_back_as_thinking(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.reasoning = "Let me think."
    client = gateway.anthropic_client(api_key)
    message = await client.messages.create(
        model=MODEL,
        max_tokens=20000,
        thinking={"type": "enabled", "budget_tokens": 10000},
        messages=HELLO,
    )
    assert sent(gateway)["reasoning_effort"] == "high"
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Let me think."  # type: ignore[union-attr]


async def test_count_tokens_is_the_estimate_and_asks_no_provider(
    gateway: Gateway, api_key: str
) -> None:
    client = gateway.anthropic_client(api_key)
    before = len(gateway.fake.received)
    counted = await client.messages.count_tokens(
        model=MODEL, system="Be brief.", messages=HELLO, tools=[ADD_TOOL]
    )
    bigger = await client.messages.count_tokens(model=MODEL, messages=HELLO * 50)
    assert 10 < counted.input_tokens < bigger.input_tokens
    assert len(gateway.fake.received) == before


async def test_count_tokens_takes_a_slot_of_the_keys_concurrency_as_a_message_does(
    gateway: Gateway,
) -> None:
    """Issue 34 item 3: the same policy as /v1/messages, its requests in flight included."""
    client = gateway.anthropic_client(await gateway.create_key(max_concurrent_requests=1))
    gateway.fake.enqueue(Behaviour(endless=True))
    async with client.messages.stream(model=MODEL, max_tokens=50, messages=HELLO) as events:
        async for _ in events:
            break  # the stream holds the key's one slot while it runs
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.count_tokens(model=MODEL, messages=HELLO)
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    await eventually(
        lambda: _counts(client), within=2.0, what="the slot is given back when the stream ends"
    )


async def _counts(client: anthropic.AsyncAnthropic) -> bool:
    try:
        await client.messages.count_tokens(model=MODEL, messages=HELLO)
    except anthropic.RateLimitError:
        return False
    return True


@pytest.mark.parametrize("header", ["x-api-key", "authorization"])
async def test_key_in_either_header_and_beta_flags_ignored(
    gateway: Gateway, api_key: str, header: str
) -> None:
    value = api_key if header == "x-api-key" else f"Bearer {api_key}"
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages?beta=true"),
            json={"model": MODEL, "max_tokens": 16, "messages": HELLO},
            headers={
                header: value,
                "anthropic-version": "2023-06-01",
                "anthropic-beta": "claude-code-20250219,made-up-flag-2099-01-01",
            },
        )
        assert response.status == 200, await response.text()
        assert (await response.json())["type"] == "message"
    assert "anthropic-beta" not in gateway.fake.received[-1].headers


async def test_gateway_refusals_are_the_sdk_error_classes(
    gateway: Gateway, api_key_for: Any
) -> None:
    with pytest.raises(anthropic.AuthenticationError) as unauthorized:
        await gateway.anthropic_client("llmg_not_a_real_key").messages.create(
            model=MODEL, max_tokens=16, messages=HELLO
        )
    body: Any = unauthorized.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["message"]

    narrow = await api_key_for(gateway, name="narrow", allowed_models=["llama-3.3-70b"])
    with pytest.raises(anthropic.PermissionDeniedError) as forbidden:
        await gateway.anthropic_client(narrow).messages.create(
            model=MODEL, max_tokens=16, messages=HELLO
        )
    assert forbidden.value.body["error"]["type"] == "permission_error"  # type: ignore[index]

    limited = await api_key_for(gateway, name="limited", rate_limit_requests=1)
    client = gateway.anthropic_client(limited)
    await client.messages.create(model=MODEL, max_tokens=16, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as throttled:
        await client.messages.create(model=MODEL, max_tokens=16, messages=HELLO)
    assert throttled.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(throttled.value.response.headers["retry-after"]) >= 1

    key = await api_key_for(gateway, name="bad-requests")
    with pytest.raises(anthropic.BadRequestError) as bad:
        await gateway.anthropic_client(key).messages.create(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "tool", "content": "not a Messages role"}],  # type: ignore[list-item,typeddict-item]
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages[0].role" in bad.value.body["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "answer"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": ["image/png"],
                                    "data": PIXEL,
                                },
                            }
                        ],
                    }
                ]
            },
            400,
        ),
        # Not ours to refuse: an effort that is no effort asks for the default.
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": ["high"]}}, 200),
    ],
)
async def test_a_list_where_a_string_belongs_is_a_400_or_ignored_never_a_500(
    gateway: Gateway, api_key: str, fields: dict[str, Any], answer: int
) -> None:
    body = {"model": MODEL, "max_tokens": 16, "messages": HELLO, **fields}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/messages"), json=body, headers={"x-api-key": api_key}
        ) as response,
    ):
        assert response.status == answer
        document = await response.json()
    if answer == 400:
        assert document["type"] == "error"
        assert document["error"]["type"] == "invalid_request_error"
        assert "media_type" in document["error"]["message"]
        assert gateway.fake.received == []


@pytest.mark.parametrize("stream", [False, True])
async def test_provider_errors_keep_status_and_message_in_anthropic_shape(
    gateway: Gateway, api_key: str, stream: bool
) -> None:
    client = gateway.anthropic_client(api_key)
    gateway.fake.enqueue(Behaviour(status=400))
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model=MODEL, max_tokens=16, messages=HELLO, stream=stream)
    assert bad.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "Invalid request parameters"},
    }
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(
            model="venice-nonexistent-rig-test", max_tokens=16, messages=HELLO, stream=stream
        )
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert missing.value.body["error"]["message"].startswith("Specified model not found")  # type: ignore[index]
    gateway.fake.fail_times(3, status=429, retry_after="0")  # the first try and both retries
    with pytest.raises(anthropic.RateLimitError) as throttled:
        await client.messages.create(model=MODEL, max_tokens=16, messages=HELLO, stream=stream)
    assert throttled.value.body["error"]["message"] == "Rate limit exceeded"  # type: ignore[index]
    assert throttled.value.response.headers["retry-after"] == "0"


def shape(message: anthropic.types.Message) -> dict[str, Any]:
    """A message without what differs between two answers to the same request (the ids)."""
    document = message.model_dump()
    document.pop("id")
    for block in document["content"]:
        block.pop("id", None)
    return document


@pytest.mark.parametrize(
    ("model", "tools"), [(MODEL, []), (TOOL_MODEL, [ADD_TOOL])], ids=["text", "tool_use"]
)
async def test_stream_final_message_equals_the_non_streamed_answer(
    gateway: Gateway, api_key: str, model: str, tools: list[Any]
) -> None:
    gateway.fake.reasoning = "Hmm."
    client = gateway.anthropic_client(api_key)
    plain = await client.messages.create(model=model, max_tokens=64, messages=HELLO, tools=tools)
    deltas: list[str] = []
    async with client.messages.stream(
        model=model, max_tokens=64, messages=HELLO, tools=tools
    ) as stream:
        async for event in stream:
            if event.type == "content_block_delta":
                deltas.append(event.delta.type)
        final = await stream.get_final_message()
    assert shape(final) == shape(plain)
    assert final.usage.input_tokens == count_prompt_tokens(HELLO)
    expected = ["thinking"] + (["tool_use"] if tools else ["text"])
    assert [block.type for block in final.content] == expected
    assert "thinking_delta" in deltas
    assert ("input_json_delta" in deltas) == bool(tools)
    assert sent(gateway)["stream_options"] == {"include_usage": True}


async def read_events(response: aiohttp.ClientResponse) -> list[tuple[str, dict[str, Any]]]:
    """Every (event name, data) of an Anthropic stream, in order."""
    events = []
    for frame in (await response.text()).split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], orjson.loads(lines["data"])))
    return events


@pytest.mark.parametrize("usage_placement", ["separate", "finish"])
async def test_stream_event_sequence_and_usage(
    gateway: Gateway, api_key: str, usage_placement: Any
) -> None:
    gateway.fake.usage_placement = usage_placement
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages"),
            json={"model": MODEL, "max_tokens": 64, "messages": HELLO, "stream": True},
            headers={"x-api-key": api_key, "anthropic-version": "2023-06-01"},
        )
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        events = await read_events(response)
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * 5,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0  # the estimate, before Venice counted
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": count_prompt_tokens(HELLO),
        "output_tokens": 5,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == "Hello from fake Venice!"


async def test_mid_stream_failure_ends_with_an_error_event(gateway: Gateway, api_key: str) -> None:
    client = gateway.anthropic_client(api_key)
    # Each failure twice: the continuation on the only deployment fails too.
    gateway.fake.enqueue(
        Behaviour(error_event_after_chunks=2), Behaviour(error_event_after_chunks=1)
    )
    with pytest.raises(anthropic.APIStatusError) as failed:
        async with client.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
            async for _ in stream:
                pass
    assert failed.value.body["error"]["type"] in ("api_error", "overloaded_error")  # type: ignore[index]

    gateway.fake.enqueue(Behaviour(drop_after_chunks=2), Behaviour(drop_after_chunks=1))
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages"),
            json={"model": MODEL, "max_tokens": 64, "messages": HELLO, "stream": True},
            headers={"x-api-key": api_key},
        )
        events = await read_events(response)
    assert events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"
    assert "message_stop" not in [name for name, _ in events]
