"""``kind = "gemini"`` end to end: the gateway in front of a fake Gemini API (checked against the
google-genai SDK in tests/test_fake_gemini.py), called with the openai and anthropic SDKs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from llmgw.config import load_settings
from tests.chat_requests import ABOUT_AN_IMAGE, HELLO, PNG, WEATHER, read_chat_stream
from tests.conftest import Gateway
from tests.fake_gemini import (
    CACHED_TOKENS,
    FAKE_GEMINI_KEY,
    THOUGHT,
    THOUGHTS_TOKENS,
    FakeGemini,
    signature_for,
)
from tests.secrets_scan import SecretScanner

MODEL = "gemini-2.5-flash"
LARGER = "gemini-2.5-pro"


def entry(name: str, fake: FakeGemini) -> str:
    return (
        f'[[providers]]\nname = "{name}"\nkind = "gemini"\nbase_url = "{fake.base_url}"\n'
        f'api_key_env = "GEMINI_API_KEY"\nmax_retries = 0\n\n'
    )


PRICES = f"""
[[prices]]
model = "gemini:{MODEL}"
input_usd_per_mtok = 0.3
output_usd_per_mtok = 2.5
cache_read_usd_per_mtok = 0.075
"""


@pytest.fixture
async def fake(secret_scanner: SecretScanner) -> AsyncIterator[FakeGemini]:
    secret_scanner.register(FAKE_GEMINI_KEY, "the fake Gemini key")
    async with FakeGemini() as fake:
        yield fake


@pytest.fixture
async def second() -> AsyncIterator[FakeGemini]:
    async with FakeGemini() as fake:
        yield fake


@pytest.fixture
async def routes(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, second: FakeGemini
) -> tuple[Gateway, str]:
    toml = entry("gemini", fake) + entry("second", second)
    toml += f'[[models]]\nalias = "flash"\ndeployments = ["gemini:{MODEL}"]\n\n'
    toml += f'[[models]]\nalias = "both"\ndeployments = ["gemini:{MODEL}", "second:{LARGER}"]\n\n'
    toml += '[[models]]\nalias = "embed"\ndeployments = ["gemini:gemini-embedding-001"]\n\n'
    toml += PRICES
    path = tmp_path / "llmgw.toml"
    path.write_text(toml)
    settings = load_settings({"LLMGW_CONFIG": str(path), "GEMINI_API_KEY": FAKE_GEMINI_KEY})
    gateway: Gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases, prices=settings.prices
    )
    return gateway, await gateway.create_key(name="gemini")


async def test_text_and_its_request(routes: tuple[Gateway, str], fake: FakeGemini) -> None:
    gateway, key = routes
    completion = await gateway.client(key).chat.completions.create(
        model="flash",
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        max_tokens=50,
        stop="END",
        temperature=0.1,
    )
    assert completion.choices[0].message.content == "Hello from fake Gemini!"
    assert completion.choices[0].finish_reason == "stop"
    [call] = fake.calls(":generateContent")
    assert call.path == f"/v1beta/models/{MODEL}:generateContent"
    assert call.headers["x-goog-api-key"] == FAKE_GEMINI_KEY
    assert call.json == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 50, "temperature": 0.1, "stopSequences": ["END"]},
    }


async def test_a_streamed_answer(routes: tuple[Gateway, str]) -> None:
    gateway, key = routes
    stream = await gateway.client(key).chat.completions.create(
        model="flash", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    read = await read_chat_stream(stream)
    assert "".join(read.texts) == "Hello from fake Gemini!" and len(read.texts) == 3
    assert read.finishes == ["stop"]
    assert read.usage is not None and read.usage.completion_tokens == 3


async def test_tool_calls_over_two_turns_keep_the_thought_signature(
    routes: tuple[Gateway, str], fake: FakeGemini
) -> None:
    """Chat callers send back only the call's id, name and arguments: the signature rides in the
    id, and the fake refuses a function call in history without it (as Gemini 3 does)."""
    gateway, key = routes
    client = gateway.client(key)
    first = await client.chat.completions.create(
        model="flash", messages=HELLO, tools=[WEATHER], reasoning_effort="low"
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.model_extra is not None and message.model_extra["reasoning_content"] == THOUGHT
    [call] = message.tool_calls or []
    assert call.function.name == "weather"
    history = [
        *HELLO,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = await client.chat.completions.create(
        model="flash", messages=history, tools=[WEATHER], reasoning_effort="low"
    )
    assert second.choices[0].message.content == "Hello from fake Gemini!"
    sent = fake.calls(":generateContent")[1].json["contents"]
    assert sent[1] == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "weather", "args": {"city": "Paris"}},
                "thoughtSignature": signature_for("weather"),
            }
        ],
    }
    assert sent[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "weather", "response": {"result": "sunny"}}}],
    }


async def test_the_signature_round_trips_for_responses_callers_too(
    routes: tuple[Gateway, str], fake: FakeGemini
) -> None:
    gateway, key = routes
    client = gateway.client(key)
    tools: Any = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    first = await client.responses.create(
        model="flash", input="hi", tools=tools, reasoning={"effort": "low"}
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    second = await client.responses.create(
        model="flash",
        tools=tools,
        reasoning={"effort": "low"},
        input=[
            {"role": "user", "content": "hi"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "weather",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
    )
    assert second.output_text == "Hello from fake Gemini!"
    part = fake.calls(":generateContent")[1].json["contents"][1]["parts"][0]
    assert part["thoughtSignature"] == signature_for("weather")


async def test_an_image_is_sent_inline(routes: tuple[Gateway, str], fake: FakeGemini) -> None:
    gateway, key = routes
    await gateway.client(key).chat.completions.create(
        model="flash",
        messages=ABOUT_AN_IMAGE,
    )
    assert fake.calls(":generateContent")[0].json["contents"][0]["parts"] == [
        {"text": "What is this?"},
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
    ]


async def test_usage_with_cached_and_thought_tokens_is_billed_per_kind(
    routes: tuple[Gateway, str],
) -> None:
    gateway, key = routes
    completion = await gateway.client(key).chat.completions.create(
        model="flash",
        messages=[{"role": "system", "content": "cached prefix"}, *HELLO],
        reasoning_effort="medium",
    )
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == THOUGHTS_TOKENS
    assert usage.completion_tokens == 3 + THOUGHTS_TOKENS
    [row] = await gateway.ledger_rows(1)
    assert row["cache_read_input_tokens"] == CACHED_TOKENS
    assert row["reasoning_output_tokens"] == THOUGHTS_TOKENS
    fresh = usage.prompt_tokens - CACHED_TOKENS
    expected = (
        fresh * Decimal("0.3")
        + CACHED_TOKENS * Decimal("0.075")
        + usage.completion_tokens * Decimal("2.5")
    ) / 1_000_000
    assert row["cost_usd"] == expected


async def test_a_blocked_prompt_is_a_content_filter_finish(routes: tuple[Gateway, str]) -> None:
    gateway, key = routes
    completion = await gateway.client(key).chat.completions.create(
        model="flash", messages=[{"role": "user", "content": "BLOCKME please"}]
    )
    assert completion.choices[0].finish_reason == "content_filter"
    assert completion.choices[0].message.content is None


async def test_a_messages_caller_is_served_translated(routes: tuple[Gateway, str]) -> None:
    gateway, key = routes
    message = await gateway.anthropic_client(key).messages.create(
        model="flash", max_tokens=64, messages=HELLO
    )
    assert message.content[0].text == "Hello from fake Gemini!"  # type: ignore[union-attr]


async def test_embeddings(routes: tuple[Gateway, str], fake: FakeGemini) -> None:
    gateway, key = routes
    answer = await gateway.client(key).embeddings.create(
        model="embed", input=["a", "b"], encoding_format="float"
    )
    assert [d.embedding for d in answer.data] == [[0.25, 0.0], [0.25, 1.0]]
    assert fake.calls(":batchEmbedContents")[0].json == {
        "requests": [
            {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "a"}]}},
            {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "b"}]}},
        ]
    }


# Errors ----------------------------------------------------------------------------------------


async def test_resource_exhausted_is_a_429_in_openais_shape(
    routes: tuple[Gateway, str], fake: FakeGemini
) -> None:
    gateway, key = routes
    fake.fail_next(429, "Resource has been exhausted (e.g. check quota).")
    answer = await gateway.post("/v1/chat/completions", key, {"model": "flash", "messages": HELLO})
    assert answer.status == 429
    error = answer.json()["error"]
    assert error["type"] == "RESOURCE_EXHAUSTED"
    assert error["message"] == "Resource has been exhausted (e.g. check quota)."


async def test_a_too_long_input_moves_the_route_on(
    routes: tuple[Gateway, str], fake: FakeGemini, second: FakeGemini
) -> None:
    gateway, key = routes
    fake.fail_next(
        400,
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
    )
    completion = await gateway.client(key).chat.completions.create(model="both", messages=HELLO)
    assert completion.choices[0].message.content == "Hello from fake Gemini!"
    assert len(second.received) == 1


async def test_a_refused_key_is_the_gateways_problem(
    routes: tuple[Gateway, str], fake: FakeGemini
) -> None:
    gateway, key = routes
    fake.fail_next(403, "Permission denied: Consumer has been suspended.")
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="flash", messages=HELLO)
    assert refused.value.status_code == 502
    assert refused.value.body["code"] == "upstream_auth_failed"  # type: ignore[index]


async def test_a_stream_cut_mid_answer_is_finished_on_the_next_deployment(
    routes: tuple[Gateway, str], fake: FakeGemini, second: FakeGemini
) -> None:
    gateway, key = routes
    words = [f"w{i:02d} " for i in range(20)]
    reply = "".join(words).rstrip()
    fake.reply = second.reply = reply
    fake.chunks = second.chunks = 20
    fake.cut_next(after_events=10)
    stream = await gateway.client(key).chat.completions.create(
        model="both", messages=HELLO, stream=True
    )
    text, finishes = "", []
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert text == reply and finishes == ["stop"]
    # Gemini does not continue a trailing model turn: the answer was asked again, and relayed
    # from where the caller was.
    assert second.calls(":streamGenerateContent")[0].json["contents"] == [
        {"role": "user", "parts": [{"text": "hi"}]}
    ]
    assert orjson.loads(fake.received[0].body)["contents"][0]["parts"] == [{"text": "hi"}]


async def test_a_key_gemini_does_not_know_is_the_gateways_problem(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        entry("gemini", fake) + f'[[models]]\nalias = "flash"\ndeployments = ["gemini:{MODEL}"]\n'
    )
    settings = load_settings({"LLMGW_CONFIG": str(path), "GEMINI_API_KEY": "AIza-not-the-key"})
    gateway: Gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases
    )
    key = await gateway.create_key(name="gemini")
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="flash", messages=HELLO)
    assert refused.value.status_code == 502
    assert refused.value.body["code"] == "upstream_auth_failed"  # type: ignore[index]
