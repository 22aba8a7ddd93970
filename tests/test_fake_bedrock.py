"""The fake Bedrock is checked against the official SDK: boto3 signs what the fake verifies, and
parses the fake's answers and binary event streams."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import boto3
import orjson
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.fake_bedrock import ACCESS_KEY, CACHE_READ, SECRET_KEY, Failure, FakeBedrock

MODEL = "us.meta.llama3-3-70b-instruct-v1:0"
CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"


@pytest.fixture
async def fake() -> AsyncIterator[FakeBedrock]:
    async with FakeBedrock(reply="Hello from fake Bedrock!", chunks=3) as fake:
        yield fake


def client(fake: FakeBedrock, secret: str = SECRET_KEY) -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=fake.endpoint_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}),
    )


def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    return asyncio.to_thread(function, *args, **kwargs)


MESSAGES = [{"role": "user", "content": [{"text": "hi"}]}]


async def test_boto3_converse_is_signed_as_the_fake_verifies_and_parses_its_answer(
    fake: FakeBedrock,
) -> None:
    answer = await in_thread(client(fake).converse, modelId=MODEL, messages=MESSAGES)
    assert answer["output"]["message"]["content"] == [{"text": "Hello from fake Bedrock!"}]
    assert answer["stopReason"] == "end_turn"
    [received] = fake.received
    assert received.model == MODEL
    assert received.raw_path == "/model/us.meta.llama3-3-70b-instruct-v1%3A0/converse"


async def test_a_wrong_secret_is_refused_as_bedrock_does(fake: FakeBedrock) -> None:
    with pytest.raises(ClientError) as refused:
        await in_thread(
            client(fake, secret="not-the-secret").converse, modelId=MODEL, messages=MESSAGES
        )
    assert refused.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert fake.received == []


def _events(stream: Any) -> Iterator[dict[str, Any]]:
    yield from stream


async def test_boto3_parses_the_converse_event_stream(fake: FakeBedrock) -> None:
    def read() -> list[dict[str, Any]]:
        answer = client(fake).converse_stream(
            modelId=MODEL,
            messages=MESSAGES,
            system=[{"text": "be brief"}, {"cachePoint": {"type": "default"}}],
            toolConfig={
                "tools": [
                    {"toolSpec": {"name": "weather", "inputSchema": {"json": {"type": "object"}}}}
                ]
            },
            additionalModelRequestFields={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        )
        return list(_events(answer["stream"]))

    events = await in_thread(read)
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    signature = [
        e["contentBlockDelta"]["delta"]["reasoningContent"]["signature"]
        for e in events
        if "signature"
        in e.get("contentBlockDelta", {}).get("delta", {}).get("reasoningContent", {})
    ]
    assert len(signature) == 1
    [start] = [e["contentBlockStart"] for e in events if "contentBlockStart" in e]
    assert start["start"]["toolUse"]["name"] == "weather"
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    assert events[-1]["metadata"]["usage"]["cacheReadInputTokens"] == CACHE_READ


async def test_boto3_parses_the_invoke_stream_and_an_exception_frame(fake: FakeBedrock) -> None:
    body = orjson.dumps(
        {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
        }
    )

    def read() -> list[dict[str, Any]]:
        answer = client(fake).invoke_model_with_response_stream(modelId=CLAUDE, body=body)
        return [
            orjson.loads(base64.b64decode(base64.b64encode(e["chunk"]["bytes"])))
            for e in answer["body"]
        ]

    events = await in_thread(read)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    fake.exception_mid_stream("throttlingException")
    with pytest.raises(ClientError) as failed:
        await in_thread(read)
    assert failed.value.response["Error"]["Code"] == "throttlingException"


async def test_boto3_reads_the_fakes_errors_as_bedrocks(fake: FakeBedrock) -> None:
    fake.fail_next(Failure("ThrottlingException", "Too many requests, please wait."))
    with pytest.raises(ClientError) as failed:
        await in_thread(client(fake).converse, modelId=MODEL, messages=MESSAGES)
    assert failed.value.response["Error"]["Code"] == "ThrottlingException"
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
