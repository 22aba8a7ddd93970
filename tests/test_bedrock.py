"""``kind = "bedrock"`` end to end: the gateway in front of a fake Bedrock that verifies every
SigV4 signature with botocore (tests/test_fake_bedrock.py checks the fake against boto3), called
with the openai and anthropic SDKs."""

from __future__ import annotations

import asyncio
import base64
import datetime
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from llmgw.config import load_settings
from llmgw.config.common import ConfigError
from tests.chat_requests import ABOUT_AN_IMAGE, HELLO, PNG, WEATHER, read_chat_stream
from tests.conftest import Gateway
from tests.fake_bedrock import (
    ACCESS_KEY,
    CACHE_READ,
    CACHE_WRITE,
    CONTAINER_TOKEN,
    ROLE_ARN,
    SECRET_KEY,
    THINKING,
    WEB_IDENTITY_TOKEN,
    Failure,
    FakeBedrock,
    signature_for,
)
from tests.secrets_scan import SecretScanner

LLAMA = "us.meta.llama3-3-70b-instruct-v1:0"
CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


def bedrock_entry(name: str, fake: FakeBedrock, *, retries: int = 0) -> str:
    return (
        f'[[providers]]\nname = "{name}"\nkind = "bedrock"\nregion = "us-east-1"\n'
        f'endpoint_url = "{fake.endpoint_url}"\nmax_retries = {retries}\n\n'
    )


def alias(name: str, *deployments: str) -> str:
    quoted = ", ".join(f'"{d}"' for d in deployments)
    return f'[[models]]\nalias = "{name}"\ndeployments = [{quoted}]\n\n'


PRICES = f"""
[[prices]]
model = "bedrock:{LLAMA}"
input_usd_per_mtok = 3
output_usd_per_mtok = 15
cache_read_usd_per_mtok = 0.3
cache_write_usd_per_mtok = 3.75
"""

CONFIG = "".join(
    [
        alias("llama", f"bedrock:{LLAMA}"),
        alias("claude", f"bedrock:{CLAUDE}"),
        alias("fallback", f"bedrock:{LLAMA}", "second:us.meta.llama3-1-405b-instruct-v1:0"),
        alias("titan", "bedrock:amazon.titan-embed-text-v2:0"),
        alias("cohere", "bedrock:cohere.embed-english-v3"),
        PRICES,
    ]
)


@pytest.fixture
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """The credential chain sees only what a test gives it: no files, no instance metadata."""
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


@pytest.fixture
async def fake(secret_scanner: SecretScanner) -> AsyncIterator[FakeBedrock]:
    """The AWS secrets it knows and issues are scanned for in every log, span and answer."""
    secret_scanner.register(SECRET_KEY, "the fake Bedrock's AWS secret key")
    async with FakeBedrock(reply="Hello from fake Bedrock!", chunks=3) as fake:
        fake.on_secret = secret_scanner.register
        yield fake


@pytest.fixture
async def second() -> AsyncIterator[FakeBedrock]:
    async with FakeBedrock(reply="Hello from fake Bedrock!", chunks=3) as fake:
        yield fake


async def start(
    start_gateway: Any, tmp_path: Path, toml: str, **environ: str
) -> tuple[Gateway, str]:
    path = tmp_path / "llmgw.toml"
    path.write_text(toml)
    settings = load_settings({"LLMGW_CONFIG": str(path), **environ})
    gateway: Gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases, prices=settings.prices
    )
    return gateway, await gateway.create_key(name="bedrock")


@pytest.fixture
async def routes(
    start_gateway: Any,
    tmp_path: Path,
    fake: FakeBedrock,
    second: FakeBedrock,
    aws_environment: pytest.MonkeyPatch,
) -> tuple[Gateway, str]:
    aws_environment.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    aws_environment.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    toml = bedrock_entry("bedrock", fake) + bedrock_entry("second", second) + CONFIG
    return await start(start_gateway, tmp_path, toml)


# Chat through Converse -------------------------------------------------------------------------


async def test_a_chat_completion_is_a_signed_converse_call(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    completion = await gateway.client(key).chat.completions.create(
        model="llama",
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        max_tokens=50,
        temperature=0.2,
        stop=["END"],
    )
    assert completion.choices[0].message.content == "Hello from fake Bedrock!"
    assert completion.choices[0].finish_reason == "stop"
    [call] = fake.calls("converse")
    # The model id is one encoded path segment, signed as sent (the fake verified it).
    assert call.raw_path == "/model/us.meta.llama3-3-70b-instruct-v1%3A0/converse"
    assert call.access_key == ACCESS_KEY
    assert call.json == {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 50, "temperature": 0.2, "stopSequences": ["END"]},
    }
    assert completion.usage is not None and completion.usage.completion_tokens == 3


async def test_a_streamed_chat_arrives_delta_by_delta(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    fake.reply, fake.chunks = "one two three four five six", 6
    stream = await gateway.client(key).chat.completions.create(
        model="llama", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    read = await read_chat_stream(stream)
    assert "".join(read.texts) == "one two three four five six"
    assert len(read.texts) == 6, "each of Bedrock's deltas is relayed as it came"
    assert read.finishes == ["stop"]
    assert read.usage is not None and read.usage.completion_tokens == 6
    assert len(fake.calls("converse-stream")) == 1


async def test_tool_calls_over_two_turns(routes: tuple[Gateway, str], fake: FakeBedrock) -> None:
    gateway, key = routes
    client = gateway.client(key)
    first = await client.chat.completions.create(
        model="llama", messages=HELLO, tools=[WEATHER], tool_choice="required"
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = message.tool_calls or []
    assert call.function.name == "weather"
    assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    sent = fake.calls("converse")[0].json
    assert sent["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "weather",
                    "inputSchema": {"json": WEATHER["function"]["parameters"]},
                    "description": "The weather in a city",
                }
            }
        ],
        "toolChoice": {"any": {}},
    }
    second = await client.chat.completions.create(
        model="llama",
        tools=[WEATHER],
        messages=[
            *HELLO,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
    )
    assert second.choices[0].message.content == "Hello from fake Bedrock!"
    turns = fake.calls("converse")[1].json["messages"]
    assert turns[1]["content"] == [
        {"toolUse": {"toolUseId": call.id, "name": "weather", "input": {"city": "Paris"}}}
    ]
    assert turns[2]["content"] == [
        {"toolResult": {"toolUseId": call.id, "content": [{"text": "sunny, 21 C"}]}}
    ]


async def test_a_streamed_tool_call(routes: tuple[Gateway, str]) -> None:
    gateway, key = routes
    stream = await gateway.client(key).chat.completions.create(
        model="llama", messages=HELLO, tools=[WEATHER], stream=True
    )
    arguments, names = "", []
    async for chunk in stream:
        for tool_call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if tool_call.function and tool_call.function.name:
                names.append(tool_call.function.name)
            arguments += (tool_call.function.arguments or "") if tool_call.function else ""
    assert names == ["weather"]
    assert orjson.loads(arguments) == {"city": "Paris"}


async def test_an_image_is_sent_as_its_bytes(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    await gateway.client(key).chat.completions.create(
        model="llama",
        messages=ABOUT_AN_IMAGE,
    )
    [call] = fake.calls("converse")
    assert call.json["messages"][0]["content"] == [
        {"text": "What is this?"},
        {"image": {"format": "png", "source": {"bytes": PNG}}},
    ]


async def test_an_image_by_url_is_refused_in_the_callers_shape(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.client(key).chat.completions.create(
            model="llama",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
                }
            ],
        )
    assert "base64" in str(refused.value)
    assert fake.received == []


# Usage, reasoning, cache, prices ---------------------------------------------------------------


async def test_usage_with_cache_and_reasoning_is_billed_per_token_kind(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    completion = await gateway.client(key).chat.completions.create(
        model="llama",
        reasoning_effort="low",
        messages=[
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "A long system prompt",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
            *HELLO,
        ],
    )
    sent = fake.calls("converse")[0].json
    assert sent["system"] == [{"text": "A long system prompt"}, {"cachePoint": {"type": "default"}}]
    assert sent["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": 2048}
    }
    answer = completion.choices[0].message
    assert answer.model_extra is not None and answer.model_extra["reasoning_content"] == THINKING
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == CACHE_READ
    fresh = usage.prompt_tokens - CACHE_READ - CACHE_WRITE
    [row] = await gateway.ledger_rows(1)
    assert (row["cache_read_input_tokens"], row["cache_creation_input_tokens"]) == (
        CACHE_READ,
        CACHE_WRITE,
    )
    assert row["input_tokens"] == usage.prompt_tokens
    expected = (
        fresh * Decimal(3)
        + CACHE_READ * Decimal("0.3")
        + CACHE_WRITE * Decimal("3.75")
        + usage.completion_tokens * Decimal(15)
    ) / 1_000_000
    assert (row["cost_usd"], row["cost_computed"]) == (expected, True)


async def test_thinking_and_its_signature_round_trip_through_converse_for_messages_callers(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    client = gateway.anthropic_client(key)
    tools = [{"name": "weather", "input_schema": {"type": "object"}}]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    first = await client.messages.create(
        model="llama", max_tokens=2048, thinking=thinking, tools=tools, messages=HELLO
    )
    kinds = [block.type for block in first.content]
    assert kinds == ["thinking", "tool_use"]
    assert first.content[0].signature == signature_for(THINKING)  # type: ignore[union-attr]
    use = first.content[1]
    second = await client.messages.create(
        model="llama",
        max_tokens=2048,
        thinking=thinking,
        tools=tools,
        messages=[
            *HELLO,
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],  # type: ignore[union-attr]
            },
        ],
    )
    # The fake refuses a reasoning block whose signature is not the one it issued.
    assert second.content[-1].type == "text"
    history = fake.calls("converse")[1].json["messages"][1]["content"]
    assert history[0] == {
        "reasoningContent": {
            "reasoningText": {"text": THINKING, "signature": signature_for(THINKING)}
        }
    }


# Claude's Messages through InvokeModel ---------------------------------------------------------


async def test_messages_for_claude_are_passed_through_invoke_model(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    client = gateway.anthropic_client(key)
    message = await client.messages.create(
        model="claude",
        max_tokens=64,
        messages=HELLO,
        metadata={"user_id": "u-1"},
        extra_headers={"anthropic-beta": "context-1m-2025-08-07, interleaved-thinking-2025-05-14"},
    )
    assert message.content[0].text == "Hello from fake Bedrock!"  # type: ignore[union-attr]
    assert message.usage.cache_read_input_tokens == CACHE_READ
    [call] = fake.calls("invoke")
    assert call.raw_path == ("/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke")
    assert call.json == {
        "max_tokens": 64,
        "messages": HELLO,
        "metadata": {"user_id": "u-1"},
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"],
    }
    async with client.messages.stream(model="claude", max_tokens=64, messages=HELLO) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Hello from fake Bedrock!" and len(texts) == 3
    assert final.stop_reason == "end_turn"
    assert len(fake.calls("invoke-with-response-stream")) == 1
    counted = await client.messages.count_tokens(model="claude", messages=HELLO)
    [count] = fake.calls("count-tokens")
    asked = orjson.loads(base64.b64decode(count.json["input"]["invokeModel"]["body"]))
    assert asked["messages"] == HELLO and counted.input_tokens > 0


async def test_chat_for_claude_goes_through_converse(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    await gateway.client(key).chat.completions.create(model="claude", messages=HELLO)
    assert len(fake.calls("converse")) == 1 and fake.calls("invoke") == []


# Embeddings ------------------------------------------------------------------------------------


async def test_embeddings_through_titan_and_cohere(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    client = gateway.client(key)
    titan = await client.embeddings.create(model="titan", input=["a", "b"], dimensions=4)
    # The SDK asks for base64 (float32), which it decodes.
    assert [d.embedding for d in titan.data] == [pytest.approx([0.0, 0.001, 0.002, 0.003])] * 2
    assert [c.json for c in fake.calls("invoke")] == [
        {"inputText": "a", "dimensions": 4},
        {"inputText": "b", "dimensions": 4},
    ]
    assert titan.usage.prompt_tokens > 0
    cohere = await client.embeddings.create(model="cohere", input=["x", "y"])
    assert [d.embedding for d in cohere.data] == [[0.5, -0.25, 0.0], [0.5, -0.25, 1.0]]
    assert fake.calls("invoke")[-1].json == {"texts": ["x", "y"], "input_type": "search_document"}
    assert cohere.usage.prompt_tokens > 0


# Errors ----------------------------------------------------------------------------------------


async def test_throttling_is_a_429_with_bedrocks_wait(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    fake.fail_next(Failure("ThrottlingException", "Too many requests", retry_after="7"))
    answer = await gateway.post("/v1/chat/completions", key, {"model": "llama", "messages": HELLO})
    assert answer.status == 429
    assert answer.headers["Retry-After"] == "7"
    error = answer.json()["error"]
    assert error["message"] == "Too many requests"
    assert error["type"] == "ThrottlingException"


async def test_a_too_long_input_moves_the_route_to_its_next_deployment(
    routes: tuple[Gateway, str], fake: FakeBedrock, second: FakeBedrock
) -> None:
    gateway, key = routes
    fake.fail_next(Failure("ValidationException", "Input is too long for requested model."))
    completion = await gateway.client(key).chat.completions.create(model="fallback", messages=HELLO)
    assert completion.choices[0].message.content == "Hello from fake Bedrock!"
    assert len(fake.received) == 1 and len(second.received) == 1


async def test_a_model_not_ready_is_retried(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    aws_environment.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    aws_environment.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    toml = bedrock_entry("bedrock", fake, retries=2) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    fake.fail_next(
        Failure("ModelNotReadyException", "Model is not ready for inference.", retry_after="0"),
        Failure("ServiceUnavailableException", "Service unavailable.", retry_after="0"),
    )
    completion = await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert completion.choices[0].message.content == "Hello from fake Bedrock!"
    assert len(fake.received) == 3


async def test_access_denied_is_the_gateways_credentials_problem(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    fake.fail_next(Failure("AccessDeniedException", "You don't have access to the model."))
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert refused.value.status_code == 502
    assert refused.value.body["code"] == "upstream_auth_failed"  # type: ignore[index]


async def test_a_wrong_secret_is_refused_by_the_signature_check(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    aws_environment.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    aws_environment.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    toml = bedrock_entry("bedrock", fake) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert refused.value.status_code == 502
    assert fake.refused == ["InvalidSignatureException"]


async def test_a_messages_caller_gets_bedrocks_errors_in_anthropics_shape(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    fake.fail_next(Failure("ThrottlingException", "Too many requests"))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/messages"),
            json={"model": "claude", "max_tokens": 10, "messages": HELLO},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        ) as response,
    ):
        assert response.status == 429
        body = await response.json()
    assert body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Too many requests"},
    }


# Credentials -----------------------------------------------------------------------------------


async def test_a_credential_that_expires_is_refreshed_before_it_is_used(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    """Container credentials (ECS, EKS Pod Identity) expiring within botocore's refresh window
    are fetched again before the next request is signed; the expired one is never sent."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        aws_environment.delenv(name, raising=False)
    aws_environment.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", fake.credentials_url)
    aws_environment.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", CONTAINER_TOKEN)
    toml = bedrock_entry("bedrock", fake) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    client = gateway.client(key)

    await client.chat.completions.create(model="llama", messages=HELLO)
    used = fake.received[-1].access_key
    assert used in fake.issued
    assert fake.received[-1].headers["x-amz-security-token"].startswith("FwoFakeSession")
    fake.expire(used)  # its time is up: Bedrock would refuse it now
    issued = len(fake.issued)

    await client.chat.completions.create(model="llama", messages=HELLO)
    assert len(fake.issued) > issued, "fetched again before the next request was signed"
    assert fake.received[-1].access_key == fake.issued[-1] != used
    assert fake.refused == []


async def test_a_credential_far_from_expiry_is_not_fetched_again(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        aws_environment.delenv(name, raising=False)
    aws_environment.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", fake.credentials_url)
    aws_environment.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", CONTAINER_TOKEN)
    fake.credential_lifetime = datetime.timedelta(hours=6)
    toml = bedrock_entry("bedrock", fake) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    for _ in range(3):
        await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert len(fake.issued) == 1
    assert {r.access_key for r in fake.received} == {fake.issued[0]}


async def test_no_credentials_at_all_is_said_without_a_secret(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        aws_environment.delenv(name, raising=False)
    toml = bedrock_entry("bedrock", fake) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert refused.value.status_code == 502
    assert "no AWS credentials" in str(refused.value)
    assert fake.received == []


# A stream cut mid-answer -----------------------------------------------------------------------


async def test_a_stream_cut_mid_answer_is_finished_on_the_next_deployment(
    routes: tuple[Gateway, str], fake: FakeBedrock, second: FakeBedrock
) -> None:
    gateway, key = routes
    words = [f"w{i:02d} " for i in range(20)]
    reply = "".join(words).rstrip()
    fake.reply, fake.chunks = reply, 20
    second.reply, second.chunks = reply, 20
    fake.cut_next(after_frames=11)  # messageStart and 10 words reach the caller
    body = (
        await gateway.post(
            "/v1/chat/completions", key, {"model": "fallback", "messages": HELLO, "stream": True}
        )
    ).body
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
    chunks = [orjson.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == reply
    # The second deployment was asked to continue the text the caller already had.
    [continued] = second.calls("converse-stream")
    turns = continued.json["messages"]
    assert turns[-1]["role"] == "assistant"
    assert turns[-1]["content"] == [{"text": "".join(words[:10]).rstrip()}]


async def test_a_delta_reaches_the_caller_before_bedrock_sends_the_next(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    fake.reply, fake.chunks = "first second third", 3
    fake.hold, fake.hold_after = asyncio.Event(), 2  # messageStart and the first delta, then wait
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "llama", "messages": HELLO, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        seen = b""
        async with asyncio.timeout(10):  # a gateway that buffered would wait here for ever
            while b"first" not in seen:
                seen += await response.content.readany()
        fake.hold.set()
        seen += await response.read()
    assert seen.endswith(b"data: [DONE]\n\n")


async def test_a_messages_stream_of_another_model_is_translated_from_converse(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    client = gateway.anthropic_client(key)
    async with client.messages.stream(model="llama", max_tokens=64, messages=HELLO) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Hello from fake Bedrock!"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3
    assert len(fake.calls("converse-stream")) == 1 and fake.calls("invoke") == []
    counted = await client.messages.count_tokens(model="llama", messages=HELLO)
    [count] = fake.calls("count-tokens")
    assert count.json["input"]["converse"]["messages"] == [
        {"role": "user", "content": [{"text": "hi"}]}
    ]
    assert counted.input_tokens > 0


async def test_an_exception_frame_mid_stream_is_continued_on_the_next_deployment(
    routes: tuple[Gateway, str], fake: FakeBedrock, second: FakeBedrock
) -> None:
    gateway, key = routes
    fake.exception_mid_stream("throttlingException")  # after messageStart and two deltas
    stream = await gateway.client(key).chat.completions.create(
        model="fallback", messages=HELLO, stream=True
    )
    text = ""
    async for chunk in stream:
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert text == "Hello from fake Bedrock!"
    assert len(second.calls("converse-stream")) == 1


async def test_a_responses_caller_is_served_through_converse(
    routes: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gateway, key = routes
    response = await gateway.client(key).responses.create(
        model="llama", input="hi", instructions="Be brief."
    )
    assert response.output_text == "Hello from fake Bedrock!"
    [call] = fake.calls("converse")
    assert call.json["system"] == [{"text": "Be brief."}]


async def test_irsa_web_identity_credentials_from_sts(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    """As on EKS with IRSA: the role and the projected token in the environment, STS assumes it."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION"):
        aws_environment.delenv(name, raising=False)
    token = tmp_path / "token"
    token.write_text(WEB_IDENTITY_TOKEN)
    aws_environment.setenv("AWS_ROLE_ARN", ROLE_ARN)
    aws_environment.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    aws_environment.setenv("AWS_ENDPOINT_URL_STS", fake.endpoint_url)
    fake.credential_lifetime = datetime.timedelta(hours=1)
    toml = bedrock_entry("bedrock", fake) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    for _ in range(2):
        await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    [issued] = fake.issued
    assert [r.access_key for r in fake.received] == [issued, issued]


async def test_a_shared_profile_names_the_credentials(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    aws_environment.setenv("AWS_ACCESS_KEY_ID", "AKIAOTHERKEYNOTUSED1")  # a profile wins over these
    aws_environment.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    (tmp_path / "aws-credentials").write_text(
        f"[team]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    toml = bedrock_entry("bedrock", fake).replace(
        'region = "us-east-1"\n', 'region = "us-east-1"\nprofile = "team"\n'
    ) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert [r.access_key for r in fake.received] == [ACCESS_KEY]


# Configuration ---------------------------------------------------------------------------------


def test_an_entry_needs_a_region_and_no_base_url(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text('[[providers]]\nname = "b"\nkind = "bedrock"\nregion = "eu-central-1"\n')
    [provider] = load_settings({"LLMGW_CONFIG": str(path)}).providers
    assert provider.base_url == "https://bedrock-runtime.eu-central-1.amazonaws.com"
    assert provider.capabilities.native_messages and provider.capabilities.reasoning


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ("", "providers[0].region: is required"),
        ('region = "Frankfurt"\n', 'providers[0].region: expected an AWS region, "us-east-1"'),
        ('region = "us-east-1"\nendpoint_url = "vpce"\n', "providers[0].endpoint_url"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_key(tmp_path: Path, keys: str, says: str) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(f'[[providers]]\nname = "b"\nkind = "bedrock"\n{keys}')
    with pytest.raises(ConfigError) as refused:
        load_settings({"LLMGW_CONFIG": str(path)})
    assert says in str(refused.value)


async def test_a_role_sts_refuses_is_the_gateways_problem(
    start_gateway: Any, tmp_path: Path, fake: FakeBedrock, aws_environment: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        aws_environment.delenv(name, raising=False)
    token = tmp_path / "token"
    token.write_text("a token STS does not know")
    aws_environment.setenv("AWS_ROLE_ARN", ROLE_ARN)
    aws_environment.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    aws_environment.setenv("AWS_ENDPOINT_URL_STS", fake.endpoint_url)
    toml = bedrock_entry("bedrock", fake) + alias("llama", f"bedrock:{LLAMA}")
    gateway, key = await start(start_gateway, tmp_path, toml)
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="llama", messages=HELLO)
    assert refused.value.status_code == 502
    assert refused.value.body["code"] == "upstream_auth_failed"  # type: ignore[index]
    assert fake.received == []
