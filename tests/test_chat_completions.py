"""POST /v1/chat/completions through the official openai SDK, against the fake Venice."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tests.conftest import Gateway
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour

MESSAGES = [{"role": "user", "content": "Say hello to the gateway tests"}]


async def test_plain_completion_returns_venice_answer_and_venice_gets_its_own_key(
    gateway: Gateway, api_key: str
) -> None:
    client = gateway.client(api_key)
    completion = await client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)

    assert completion.choices[0].message.content == "Hello from fake Venice!"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    received = gateway.fake.received[-1]
    assert received.headers["authorization"] == f"Bearer {FAKE_VENICE_KEY}"
    assert api_key not in str(received.headers)


async def test_unknown_fields_reach_venice_unchanged(gateway: Gateway, api_key: str) -> None:
    client = gateway.client(api_key)
    extra = {
        "venice_parameters": {"enable_web_search": "auto", "character_slug": "alan"},
        "response_format": {"type": "json_object"},
        "some_future_field": {"nested": [1, 2, 3]},
    }
    await client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES, extra_body=extra)

    sent = gateway.fake.received[-1].json
    for name, value in extra.items():
        assert sent[name] == value
    assert sent["messages"] == MESSAGES


async def test_client_hop_by_hop_and_custom_headers_are_not_forwarded(
    gateway: Gateway, api_key: str
) -> None:
    client = gateway.client(api_key, default_headers={"X-Secret-Client-Header": "nope"})
    await client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)

    headers = gateway.fake.received[-1].headers
    assert "x-secret-client-header" not in headers
    assert headers["authorization"] == f"Bearer {FAKE_VENICE_KEY}"


async def test_sync_client_plain_and_streamed(gateway: Gateway, api_key: str) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=api_key, max_retries=0)

    def call() -> tuple[str | None, str]:
        plain = client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
        stream = client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        return plain.choices[0].message.content, text

    plain_text, streamed_text = await asyncio.to_thread(call)
    assert plain_text == streamed_text == "Hello from fake Venice!"


async def test_stream_delivers_every_chunk_and_done(gateway: Gateway, api_key: str) -> None:
    gateway.fake.reply = "héllo wörld ✓ ünïcode ßplit"
    gateway.fake.chunks = 9
    client = gateway.client(api_key)
    stream = await client.chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    assert "".join(pieces) == "héllo wörld ✓ ünïcode ßplit"


async def test_stream_usage_hidden_unless_asked_but_always_requested_upstream(
    gateway: Gateway, api_key: str
) -> None:
    client = gateway.client(api_key)
    stream = await client.chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.choices for chunk in chunks), "a usage-only chunk leaked to the caller"
    assert gateway.fake.received[-1].json["stream_options"] == {"include_usage": True}

    stream = await client.chat.completions.create(
        model="qwen3-5-9b",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


async def test_streamed_tool_call_deltas(gateway: Gateway, api_key: str) -> None:
    client = gateway.client(api_key)
    tools = [
        {
            "type": "function",
            "function": {"name": "add", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    stream = await client.chat.completions.create(
        model="mistral-small-3-2-24b-instruct", messages=MESSAGES, tools=tools, stream=True
    )
    name, arguments, finish = None, "", None
    async for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name = name or (call.function.name if call.function else None)
                arguments += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    assert (name, arguments, finish) == ("add", '{"a": 4, "b": 6}', "tool_calls")


async def test_first_words_arrive_while_venice_is_still_generating(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.enqueue(Behaviour(chunk_delay=0.25))
    client = gateway.client(api_key)
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    first_content_at = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first_content_at is None:
            first_content_at = time.perf_counter() - started
    total = time.perf_counter() - started
    assert first_content_at is not None
    # 5 content chunks + finish + usage, 0.25 s apart: the whole answer takes >= 1.5 s.
    assert total >= 1.5
    assert first_content_at < 0.75


@pytest.mark.parametrize("stream", [False, True])
async def test_venice_404_keeps_status_and_body(
    gateway: Gateway, api_key: str, stream: bool
) -> None:
    client = gateway.client(api_key)
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(
            model="venice-nonexistent-rig-test", messages=MESSAGES, stream=stream
        )
    assert caught.value.status_code == 404
    assert caught.value.response.headers["content-type"].startswith("application/json")
    assert caught.value.response.json() == {
        "error": "Specified model not found: venice-nonexistent-rig-test. "
        "Did you mean: venice-uncensored-1-2, venice-uncensored-role-play?"
    }
