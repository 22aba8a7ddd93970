"""The fake Gemini is checked against the official google-genai SDK: it reads the fake's answers,
streams, function calls with thought signatures, and errors."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest
from google import genai
from google.genai import errors, types

from tests.fake_gemini import FAKE_GEMINI_KEY, THOUGHT, FakeGemini, signature_for


@pytest.fixture
async def fake() -> AsyncIterator[FakeGemini]:
    async with FakeGemini() as fake:
        yield fake


def client(fake: FakeGemini) -> genai.Client:
    return genai.Client(
        api_key=FAKE_GEMINI_KEY, http_options=types.HttpOptions(base_url=fake.base_url)
    )


async def test_the_sdk_reads_an_answer_and_a_stream(fake: FakeGemini) -> None:
    answer = await client(fake).aio.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert answer.text == "Hello from fake Gemini!"
    assert answer.usage_metadata is not None and answer.usage_metadata.candidates_token_count == 3
    pieces = [
        chunk.text
        async for chunk in await client(fake).aio.models.generate_content_stream(
            model="gemini-2.5-flash", contents="hi"
        )
    ]
    assert "".join(p or "" for p in pieces) == "Hello from fake Gemini!" and len(pieces) == 3


async def test_the_sdk_reads_thoughts_and_a_signed_function_call(fake: FakeGemini) -> None:
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(name="weather")])],
        thinking_config=types.ThinkingConfig(thinking_budget=1024, include_thoughts=True),
    )
    answer = await client(fake).aio.models.generate_content(
        model="gemini-2.5-flash", contents="hi", config=config
    )
    assert answer.candidates is not None
    content = answer.candidates[0].content
    assert content is not None and content.parts is not None
    thought, call = content.parts
    assert (thought.thought, thought.text) == (True, THOUGHT)
    assert call.function_call is not None and call.function_call.name == "weather"
    assert call.thought_signature == base64.b64decode(
        signature_for("weather")
    )  # base64 on the wire


async def test_the_sdk_reads_the_fakes_errors(fake: FakeGemini) -> None:
    fake.fail_next(429)
    with pytest.raises(errors.ClientError) as failed:
        await client(fake).aio.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert failed.value.code == 429 and failed.value.status == "RESOURCE_EXHAUSTED"
