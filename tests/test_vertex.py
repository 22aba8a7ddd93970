"""``kind = "vertex"`` end to end: google-auth obtains its token from the fake's token endpoint
through a service-account file, and the gateway calls the fake's Vertex AI Gemini API with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from llmgw.config import load_settings
from llmgw.config.common import ConfigError
from tests.conftest import Gateway
from tests.fake_gemini import THOUGHT, FakeGemini, signature_for
from tests.secrets_scan import SecretScanner

MODEL = "gemini-2.5-flash"
CLAUDE = "claude-sonnet-4-5@20250929"
HELLO = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def private_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.fixture
async def fake(secret_scanner: SecretScanner, private_key: str) -> AsyncIterator[FakeGemini]:
    secret_scanner.register(private_key.splitlines()[5], "the service account's private key")
    async with FakeGemini() as fake:
        fake.on_secret = secret_scanner.register
        yield fake


def service_account_file(tmp_path: Path, fake: FakeGemini, private_key: str) -> Path:
    path = tmp_path / "service-account.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "llmgw-test",
                "private_key_id": "0123456789abcdef",
                "private_key": private_key,
                "client_email": "llmgw@llmgw-test.iam.gserviceaccount.com",
                "client_id": "1234567890",
                "token_uri": fake.token_uri,
            }
        )
    )
    return path


async def start(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> tuple[Gateway, str]:
    credentials = service_account_file(tmp_path, fake, private_key)
    path = tmp_path / "llmgw.toml"
    path.write_text(
        f'[[providers]]\nname = "vertex"\nkind = "vertex"\nproject = "llmgw-test"\n'
        f'location = "us-central1"\nendpoint_url = "{fake.base_url}"\n'
        f'credentials_file = "{credentials}"\nmax_retries = 0\n\n'
        f'[[models]]\nalias = "flash"\ndeployments = ["vertex:{MODEL}"]\n'
    )
    settings = load_settings({"LLMGW_CONFIG": str(path)})
    gateway: Gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases
    )
    return gateway, await gateway.create_key(name="vertex")


async def test_a_token_from_the_service_account_file_reaches_vertex(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start(start_gateway, tmp_path, fake, private_key)
    client = gateway.client(key)
    completion = await client.chat.completions.create(model="flash", messages=HELLO)
    assert completion.choices[0].message.content == "Hello from fake Gemini!"
    [call] = fake.received
    assert call.path == (
        f"/v1/projects/llmgw-test/locations/us-central1/publishers/google/models/{MODEL}"
        ":generateContent"
    )
    assert call.headers["authorization"].removeprefix("Bearer ") in fake.tokens
    stream = await client.chat.completions.create(model="flash", messages=HELLO, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from fake Gemini!"
    assert fake.token_requests == 1, "a token valid for an hour is reused"


async def test_a_token_close_to_its_expiry_is_replaced_before_it_is_sent(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    fake.token_lifetime = 120  # inside google-auth's 3 min 45 s: due for renewal at once
    gateway, key = await start(start_gateway, tmp_path, fake, private_key)
    for _ in range(2):
        await gateway.client(key).chat.completions.create(model="flash", messages=HELLO)
    assert fake.token_requests == 2
    tokens = [r.headers["authorization"] for r in fake.received]
    assert tokens[0] != tokens[1]


async def test_a_refused_token_is_renewed_and_the_request_sent_once_more(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start(start_gateway, tmp_path, fake, private_key)
    client = gateway.client(key)
    await client.chat.completions.create(model="flash", messages=HELLO)
    fake.expire_tokens()  # revoked, or expired early: Vertex answers 401
    completion = await client.chat.completions.create(model="flash", messages=HELLO)
    assert completion.choices[0].message.content == "Hello from fake Gemini!"
    assert fake.token_requests == 2


async def test_a_broken_service_account_is_the_gateways_problem(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start(start_gateway, tmp_path, fake, private_key)
    (tmp_path / "service-account.json").write_text("{}")
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(key).chat.completions.create(model="flash", messages=HELLO)
    assert refused.value.status_code == 502
    assert refused.value.body["code"] == "upstream_auth_failed"  # type: ignore[index]
    assert fake.received == []


async def test_the_thought_signature_round_trips_on_vertex(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start(start_gateway, tmp_path, fake, private_key)
    client = gateway.client(key)
    first = await client.chat.completions.create(
        model="flash", messages=HELLO, tools=[WEATHER], reasoning_effort="high"
    )
    message = first.choices[0].message
    assert message.model_extra is not None and message.model_extra["reasoning_content"] == THOUGHT
    [call] = message.tool_calls or []
    second = await client.chat.completions.create(
        model="flash",
        tools=[WEATHER],
        reasoning_effort="high",
        messages=[
            *HELLO,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
    )
    assert second.choices[0].message.content == "Hello from fake Gemini!"
    sent = fake.calls(":generateContent")[1].json["contents"][1]["parts"][0]
    assert sent["thoughtSignature"] == signature_for("weather")


def test_the_endpoint_follows_the_location(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        '[[providers]]\nname = "a"\nkind = "vertex"\nproject = "my-project"\n'
        'location = "europe-west4"\n\n'
        '[[providers]]\nname = "b"\nkind = "vertex"\nproject = "my-project"\n'
    )
    a, b = load_settings({"LLMGW_CONFIG": str(path)}).providers
    assert a.base_url == "https://europe-west4-aiplatform.googleapis.com"
    assert b.base_url == "https://aiplatform.googleapis.com"


def test_a_project_is_required(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text('[[providers]]\nname = "a"\nkind = "vertex"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings({"LLMGW_CONFIG": str(path)})
    assert "providers[0].project: is required" in str(refused.value)


# Messages: Claude's passed through, Gemini's translated ------------------------------------------


async def start_with_claude(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> tuple[Gateway, str]:
    gateway, _ = await start(start_gateway, tmp_path, fake, private_key)
    await gateway.server.close()
    credentials = tmp_path / "service-account.json"
    path = tmp_path / "llmgw.toml"
    path.write_text(
        f'[[providers]]\nname = "vertex"\nkind = "vertex"\nproject = "llmgw-test"\n'
        f'location = "us-east5"\nendpoint_url = "{fake.base_url}"\n'
        f'credentials_file = "{credentials}"\nmax_retries = 0\n\n'
        f'[[models]]\nalias = "flash"\ndeployments = ["vertex:{MODEL}"]\n\n'
        f'[[models]]\nalias = "sonnet"\ndeployments = ["vertex:{CLAUDE}"]\n'
    )
    settings = load_settings({"LLMGW_CONFIG": str(path)})
    gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases
    )
    return gateway, await gateway.create_key(name="vertex")


async def test_messages_for_claude_are_passed_through_raw_predict(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start_with_claude(start_gateway, tmp_path, fake, private_key)
    client = gateway.anthropic_client(key)
    message = await client.messages.create(
        model="sonnet",
        max_tokens=64,
        messages=HELLO,
        extra_headers={"anthropic-beta": "context-1m-2025-08-07"},
    )
    assert message.content[0].text == "Hello from fake Gemini!"  # type: ignore[union-attr]
    [call] = fake.received
    assert call.path == (
        f"/v1/projects/llmgw-test/locations/us-east5/publishers/anthropic/models/{CLAUDE}:rawPredict"
    )
    assert call.json == {
        "max_tokens": 64,
        "messages": HELLO,
        "anthropic_version": "vertex-2023-10-16",
    }
    assert call.headers["anthropic-beta"] == "context-1m-2025-08-07"
    async with client.messages.stream(model="sonnet", max_tokens=64, messages=HELLO) as stream:
        texts = [text async for text in stream.text_stream]
    assert "".join(texts) == "Hello from fake Gemini!" and len(texts) == 3
    assert fake.received[-1].path.endswith(":streamRawPredict")
    assert fake.received[-1].json["stream"] is True
    counted = await client.messages.count_tokens(model="sonnet", messages=HELLO)
    assert counted.input_tokens > 0
    assert fake.received[-1].path.endswith("/publishers/anthropic/models/count-tokens:rawPredict")
    assert fake.received[-1].json["model"] == CLAUDE


async def test_chat_for_claude_on_vertex_is_translated_to_messages(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start_with_claude(start_gateway, tmp_path, fake, private_key)
    client = gateway.client(key)
    completion = await client.chat.completions.create(model="sonnet", messages=HELLO)
    assert completion.choices[0].message.content == "Hello from fake Gemini!"
    assert fake.received[-1].json["messages"] == HELLO
    stream = await client.chat.completions.create(model="sonnet", messages=HELLO, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from fake Gemini!"


async def test_messages_for_gemini_on_vertex_are_translated(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start_with_claude(start_gateway, tmp_path, fake, private_key)
    client = gateway.anthropic_client(key)
    message = await client.messages.create(model="flash", max_tokens=64, messages=HELLO)
    assert message.content[0].text == "Hello from fake Gemini!"  # type: ignore[union-attr]
    async with client.messages.stream(model="flash", max_tokens=64, messages=HELLO) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Hello from fake Gemini!"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3
    counted = await client.messages.count_tokens(model="flash", messages=HELLO)
    assert counted.input_tokens > 0 and fake.received[-1].path.endswith(":countTokens")


async def test_embeddings_through_predict(
    start_gateway: Any, tmp_path: Path, fake: FakeGemini, private_key: str
) -> None:
    gateway, key = await start(start_gateway, tmp_path, fake, private_key)
    answer = await gateway.client(key).embeddings.create(
        model="vertex/gemini-embedding-001", input=["a", "b"], encoding_format="float", dimensions=2
    )
    assert [d.embedding for d in answer.data] == [[0.5, 0.0], [0.5, 1.0]]
    assert answer.usage.prompt_tokens == 4
    assert fake.received[-1].path.endswith("/models/gemini-embedding-001:predict")
    assert fake.received[-1].json == {
        "instances": [{"content": "a"}, {"content": "b"}],
        "parameters": {"outputDimensionality": 2},
    }
