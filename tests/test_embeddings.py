"""POST /v1/embeddings through the openai SDK: routed, rate-limited, observed and billed like chat."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from opentelemetry.trace import SpanKind

from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway
from tests.fake_openai import FAKE_OPENAI_KEY, FakeOpenAI, providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice

MODEL = "text-embedding-qwen3-0-6b"


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


async def test_embeddings_through_the_sdk_reach_venice_unchanged(
    gateway: Gateway, api_key: str
) -> None:
    result = await gateway.client(api_key).embeddings.create(
        model=MODEL, input=["the quick brown fox", "jumps"], dimensions=4
    )
    assert [item.index for item in result.data] == [0, 1]
    assert all(len(item.embedding) == 4 for item in result.data)
    assert result.usage.prompt_tokens == 5
    sent = gateway.fake.received[-1]
    assert sent.path == "/api/v1/embeddings"
    assert sent.json["model"] == MODEL
    assert sent.json["input"] == ["the quick brown fox", "jumps"]
    assert sent.headers["authorization"] == f"Bearer {FAKE_VENICE_KEY}"


async def test_embeddings_are_recorded_like_chat(
    gateway: Gateway, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.billing")
    await gateway.client(api_key).embeddings.create(model=MODEL, input="three small words")

    span = gateway.telemetry.span(f"embeddings {MODEL}")
    attributes = dict(span.attributes)
    assert span.kind == SpanKind.CLIENT
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "embeddings"
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "venice"
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == MODEL
    assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in attributes
    server = gateway.telemetry.span("POST /v1/embeddings")
    assert span.parent.span_id == server.context.span_id

    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "llmgw.billing"]
    assert (record.operation, record.provider, record.model) == ("embeddings", "venice", MODEL)
    assert (record.input_tokens, record.status, record.outcome) == (3, 200, "completed")
    assert record.stream is False

    durations = gateway.telemetry.metric_points(sc.METRIC_OPERATION_DURATION)
    assert any(p.attributes[sc.GEN_AI_OPERATION_NAME] == "embeddings" for p in durations)


async def test_embeddings_are_rate_limited_per_key(start_gateway: Any, api_key_for: Any) -> None:
    gateway = await start_gateway()
    key = await api_key_for(gateway, rate_limit_requests=1, rate_limit_window_seconds=60)
    client = gateway.client(key)
    await client.embeddings.create(model=MODEL, input="once")
    with pytest.raises(openai.RateLimitError) as caught:
        await client.embeddings.create(model=MODEL, input="twice")
    assert caught.value.status_code == 429
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    assert len([r for r in gateway.fake.received if r.path.endswith("/embeddings")]) == 1


async def test_embeddings_need_a_key_and_a_model_and_input(gateway: Gateway, api_key: str) -> None:
    url = gateway.url("/v1/embeddings")
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json={"model": MODEL, "input": "x"}) as response:
            assert response.status == 401
        headers = {"Authorization": f"Bearer {api_key}"}
        for body, param in (({"input": "x"}, "model"), ({"model": MODEL}, "input")):
            async with session.post(url, json=body, headers=headers) as response:
                assert response.status == 400
                assert (await response.json())["error"]["param"] == param
    assert gateway.fake.received == []


async def test_venice_errors_keep_their_status_and_body(gateway: Gateway, api_key: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await gateway.client(api_key).embeddings.create(model="nonexistent-embedder", input="x")
    assert "Specified model not found" in caught.value.response.json()["error"]


async def test_embeddings_are_routed_and_fall_back_like_chat(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = f"""
[[providers]]
name = "venice"
kind = "venice"
base_url = "{fake_venice.base_url}"
api_key_env = "VENICE_API_KEY"
max_retries = 0

[[providers]]
name = "openai"
kind = "openai-compatible"
base_url = "{fake_openai.base_url}"
api_key_env = "OPENAI_API_KEY"

[[models]]
alias = "embedder"
deployments = ["venice:{MODEL}", "openai:text-embedding-3-small"]
"""
    gateway: Gateway = await start_gateway(
        **providers_settings(
            tmp_path, toml, VENICE_API_KEY=FAKE_VENICE_KEY, OPENAI_API_KEY=FAKE_OPENAI_KEY
        )
    )
    client = gateway.client(await gateway.create_key())

    await client.embeddings.create(model="openai/text-embedding-3-small", input="direct")
    assert fake_openai.calls("/v1/embeddings")[-1].json["model"] == "text-embedding-3-small"

    gateway.fake.fail_times(1, status=503)
    result = await client.embeddings.create(model="embedder", input="fall back")
    assert result.model == "text-embedding-3-small"
    assert len(fake_openai.calls("/v1/embeddings")) == 2
    attributes = dict(gateway.telemetry.span("embeddings embedder").attributes)
    assert attributes[sc.LLMGW_DEPLOYMENT] == "openai:text-embedding-3-small"
    assert attributes[sc.LLMGW_DEPLOYMENTS_TRIED] == 2
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"
