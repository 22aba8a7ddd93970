"""The fake Azure resource is what the official SDK's ``AzureOpenAI`` expects: its URLs, its key
header, and answers and errors its parser reads as Azure's (shared/azure-openai.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import openai
import orjson
import pytest

from tests.fake_azure import (
    FAKE_AZURE_KEY,
    GA_API_VERSION,
    PROMPT_FILTER_RESULTS,
    PROMPT_FILTERED,
    FakeAzure,
    RateLimited,
)

MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeAzure]:
    async with FakeAzure() as fake:
        yield fake


@pytest.fixture
async def clients() -> AsyncIterator[list[openai.AsyncOpenAI]]:
    """The SDK clients a test made, closed in its own loop (not by the garbage collector, in
    whichever test's loop runs then)."""
    made: list[openai.AsyncOpenAI] = []
    yield made
    for client in made:
        await client.close()


def azure_sdk(
    fake: FakeAzure, clients: list[openai.AsyncOpenAI], api_version: str = GA_API_VERSION
) -> openai.AsyncAzureOpenAI:
    client = openai.AsyncAzureOpenAI(
        azure_endpoint=fake.endpoint, api_version=api_version, api_key=FAKE_AZURE_KEY, max_retries=0
    )
    clients.append(client)
    return client


async def test_the_azure_sdk_reaches_a_deployment_and_reads_its_stream(
    fake: FakeAzure, clients: list[openai.AsyncOpenAI]
) -> None:
    client = azure_sdk(fake, clients)
    completion = await client.chat.completions.create(model="prod-chat", messages=MESSAGES)
    assert completion.choices[0].message.content == "Hello from fake Azure!"
    assert completion.model == "gpt-4o-2024-11-20"
    stream = await client.chat.completions.create(
        model="prod-chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert (chunks[0].choices, chunks[0].id, chunks[0].model) == ([], "", "")
    assert (chunks[0].model_extra or {})["prompt_filter_results"] == PROMPT_FILTER_RESULTS
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert [r.path for r in fake.received] == [
        f"/openai/deployments/prod-chat/chat/completions?api-version={GA_API_VERSION}"
    ] * 2
    assert all(r.headers["api-key"] == FAKE_AZURE_KEY for r in fake.received)


async def test_the_plain_sdk_reaches_the_v1_api_with_the_key_as_a_bearer_token(
    fake: FakeAzure,
    clients: list[openai.AsyncOpenAI],
) -> None:
    client = openai.AsyncOpenAI(
        base_url=f"{fake.endpoint}/openai/v1/", api_key=FAKE_AZURE_KEY, max_retries=0
    )
    clients.append(client)
    completion = await client.chat.completions.create(model="prod-chat", messages=MESSAGES)
    assert completion.choices[0].finish_reason == "stop"
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="no-such-deployment", messages=MESSAGES)
    assert missing.value.code == "DeploymentNotFound"


async def test_errors_are_azures(fake: FakeAzure, clients: list[openai.AsyncOpenAI]) -> None:
    client = azure_sdk(fake, clients)
    fake.fail_next(PROMPT_FILTERED, RateLimited(retry_after_ms=1500))
    with pytest.raises(openai.BadRequestError) as filtered:
        await client.chat.completions.create(model="prod-chat", messages=MESSAGES)
    assert (filtered.value.code, filtered.value.param) == ("content_filter", "prompt")
    assert isinstance(filtered.value.body, dict)
    assert filtered.value.body["innererror"]["code"] == "ResponsibleAIPolicyViolation"
    with pytest.raises(openai.RateLimitError) as limited:
        await client.chat.completions.create(model="prod-chat", messages=MESSAGES)
    headers = limited.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("2", "1500")
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert "Please retry after 2 seconds" in limited.value.message

    with pytest.raises(openai.AuthenticationError) as refused:
        await openai.AsyncAzureOpenAI(
            azure_endpoint=fake.endpoint, api_version=GA_API_VERSION, api_key="wrong"
        ).chat.completions.create(model="prod-chat", messages=MESSAGES)
    assert refused.value.code == "401"
    with pytest.raises(openai.NotFoundError) as unknown_version:
        await azure_sdk(fake, clients, "2099-01-01").chat.completions.create(
            model="prod-chat", messages=MESSAGES
        )
    assert unknown_version.value.message.endswith("Resource not found")


async def test_an_old_api_version_refuses_stream_options_and_the_key_must_be_api_key(
    fake: FakeAzure,
    clients: list[openai.AsyncOpenAI],
) -> None:
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied"):
        await azure_sdk(fake, clients, "2024-06-01").chat.completions.create(
            model="prod-chat",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{fake.endpoint}/openai/deployments/prod-chat/chat/completions",
            params={"api-version": GA_API_VERSION},
            data=orjson.dumps({"messages": MESSAGES}),
            headers={"Authorization": f"Bearer {FAKE_AZURE_KEY}"},
        )
        assert response.status == 401, "the classic API takes the key as api-key"
