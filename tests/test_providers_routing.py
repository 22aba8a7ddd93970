"""Several providers behind one API: the providers file, model routing, fallbacks, merged model list."""

from __future__ import annotations

import json
import logging
import math
import random
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from llmgw import app_keys
from llmgw.clocks import Clocks
from llmgw.config import load_settings
from llmgw.config.providers_file import (
    Cooldown,
    DeploymentSpec,
    ModelAlias,
    ProviderConfigError,
    ProviderSpec,
    Strategy,
)
from llmgw.middleware import OMITTED_PARAMS_HEADER
from llmgw.providers.pool import RETRY_AFTER_SECONDS
from llmgw.routing.breaker import FAILURES_TO_OPEN
from llmgw.routing.channel import CHANNEL
from llmgw.routing.registry import build_registry
from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway, eventually, gateway_env
from tests.fake_openai import FAKE_OPENAI_KEY, FakeOpenAI, providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.limits.test_store_contract import REDIS, REDIS_URL
from tests.processes import Clock, clean_env, free_port, run_llmgw

MESSAGES = [{"role": "user", "content": "route me"}]
VENICE_TEXT = "Hello from fake Venice!"
OPENAI_TEXT = "Hello from fake OpenAI!"
KEYS = {"VENICE_API_KEY": FAKE_VENICE_KEY, "OPENAI_API_KEY": FAKE_OPENAI_KEY}


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


def provider(name: str, kind: str, base_url: str, key_env: str | None = None, **extra: Any) -> str:
    lines = ["[[providers]]", f'name = "{name}"', f'kind = "{kind}"', f'base_url = "{base_url}"']
    if key_env is not None:
        lines.append(f'api_key_env = "{key_env}"')
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n\n"


def alias(name: str, *deployments: str) -> str:
    quoted = ", ".join(f'"{d}"' for d in deployments)
    return f'[[models]]\nalias = "{name}"\ndeployments = [{quoted}]\n\n'


def venice_and_openai(venice: FakeVenice, fake_openai: FakeOpenAI) -> str:
    return provider("venice", "venice", venice.base_url, "VENICE_API_KEY") + provider(
        "openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY"
    )


async def start(
    start_gateway: Any, tmp_path: Path, toml: str
) -> tuple[Gateway, openai.AsyncOpenAI]:
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))
    return gateway, gateway.client(await gateway.create_key(name="routing"))


async def answer(client: openai.AsyncOpenAI, model: str, *, stream: bool) -> str:
    if not stream:
        completion = await client.chat.completions.create(model=model, messages=MESSAGES)
        return completion.choices[0].message.content or ""
    chunks = await client.chat.completions.create(model=model, messages=MESSAGES, stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


def chat_span(gateway: Gateway, model: str) -> dict[str, Any]:
    return dict(gateway.telemetry.span(f"chat {model}").attributes)


# Acceptance 1 ------------------------------------------------------------------------------------


async def test_sdk_reaches_both_providers_by_model_name_and_models_lists_both(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = venice_and_openai(fake_venice, fake_openai) + alias("fast", "openai:gpt-4o-mini")
    gateway, client = await start(start_gateway, tmp_path, toml)

    assert await answer(client, "qwen3-5-9b", stream=False) == VENICE_TEXT
    assert await answer(client, "openai/gpt-4o-mini", stream=False) == OPENAI_TEXT
    assert fake_venice.received[-1].json["model"] == "qwen3-5-9b"
    sent = fake_openai.calls("/v1/chat/completions")[-1]
    assert sent.json["model"] == "gpt-4o-mini", "the upstream receives its own model id"
    assert sent.headers["authorization"] == f"Bearer {FAKE_OPENAI_KEY}"

    ids = {model.id for model in (await client.models.list()).data}
    assert {"qwen3-5-9b", "llama-3.3-70b", "openai/gpt-4o-mini", "fast"} <= ids
    await client.models.list()
    assert len(fake_openai.calls("/v1/models")) == 1, "the merged list is cached"

    span = chat_span(gateway, "openai/gpt-4o-mini")
    assert span[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert span[sc.SERVER_PORT] == fake_openai.port
    assert span[sc.LLMGW_DEPLOYMENT] == "openai:gpt-4o-mini"
    assert span[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert "venice.cost.usd" not in span, "cost is never invented for a provider without one"
    assert chat_span(gateway, "qwen3-5-9b")[sc.GEN_AI_PROVIDER_NAME] == "venice"
    # An adapter that reports no extras has none in the ledger either.
    assert await gateway.server.app[app_keys.LEDGER].flush()
    rows = await gateway.db.fetch(
        "SELECT provider, provider_extras::text AS extras FROM usage_events "
        "WHERE operation = 'chat' ORDER BY id"
    )
    extras = {row["provider"]: json.loads(row["extras"]) for row in rows}
    assert extras["openai"] == {}
    assert set(extras["venice"]) == {"venice.cost.usd", "venice.cost.diem"}


async def test_alias_sends_the_deployments_own_model_id(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = venice_and_openai(fake_venice, fake_openai) + alias("fast", "venice:llama-3.3-70b")
    gateway, client = await start(start_gateway, tmp_path, toml)

    assert await answer(client, "fast", stream=True) == VENICE_TEXT
    assert fake_venice.received[-1].json["model"] == "llama-3.3-70b"
    assert fake_venice.received[-1].json["stream_options"] == {"include_usage": True}
    span = chat_span(gateway, "fast")
    assert span[sc.GEN_AI_REQUEST_MODEL] == "fast"
    assert span[sc.GEN_AI_RESPONSE_MODEL] == "llama-3.3-70b"
    assert (span[sc.LLMGW_DEPLOYMENT], span[sc.LLMGW_DEPLOYMENTS_TRIED]) == (
        "venice:llama-3.3-70b",
        1,
    )


async def test_a_name_without_alias_or_known_prefix_goes_to_the_first_provider_unchanged(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY")
    _, client = await start(start_gateway, tmp_path, toml)

    assert await answer(client, "meta-llama/Llama-3-8b", stream=False) == OPENAI_TEXT
    assert fake_openai.calls("/v1/chat/completions")[-1].json["model"] == "meta-llama/Llama-3-8b"
    assert await answer(client, "venice/qwen3-5-9b", stream=False) == VENICE_TEXT
    assert fake_venice.received[-1].json["model"] == "qwen3-5-9b"


# Acceptance 2 and fallbacks ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_alias_answers_from_the_second_deployment_when_the_first_returns_503(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    stream: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.billing")
    toml = venice_and_openai(fake_venice, fake_openai)
    toml += alias("fast", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway, client = await start(start_gateway, tmp_path, toml)
    fake_venice.fail_times(1, status=503)

    assert await answer(client, "fast", stream=stream) == OPENAI_TEXT
    assert len(fake_venice.received) == 1, "not retried while another deployment is left"
    assert [r.json["model"] for r in fake_openai.calls("/v1/chat/completions")] == ["gpt-4o-mini"]
    span = chat_span(gateway, "fast")
    assert span[sc.LLMGW_DEPLOYMENT] == "openai:gpt-4o-mini"
    assert span[sc.LLMGW_DEPLOYMENTS_TRIED] == 2
    assert span[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert span[sc.SERVER_PORT] == fake_openai.port
    assert span[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert "venice.cost.usd" not in span
    assert sc.ERROR_TYPE not in span
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "llmgw.billing"]
    assert (record.provider, record.deployment, record.cost_usd) == (
        "openai",
        "openai:gpt-4o-mini",
        None,
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_alias_falls_back_when_the_first_provider_cannot_be_reached(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice, stream: bool
) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    toml = provider("down", "openai-compatible", down, max_retries=0)
    toml += provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY")
    toml += alias("sturdy", "down:gpt-4o-mini", "venice:qwen3-5-9b")
    gateway, client = await start(start_gateway, tmp_path, toml)

    assert await answer(client, "sturdy", stream=stream) == VENICE_TEXT
    span = chat_span(gateway, "sturdy")
    assert (span[sc.LLMGW_DEPLOYMENT], span[sc.LLMGW_DEPLOYMENTS_TRIED]) == ("venice:qwen3-5-9b", 2)
    assert span[sc.GEN_AI_PROVIDER_NAME] == "venice"
    assert span["venice.cost.usd"] > 0, "Venice answered, and Venice reports its cost"


async def test_a_provider_past_its_own_timeout_falls_back_within_the_request_timeout(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = provider(
        "venice",
        "venice",
        fake_venice.base_url,
        "VENICE_API_KEY",
        timeout_seconds=0.5,
        max_retries=0,
    )
    toml += provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("fast", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway, client = await start(start_gateway, tmp_path, toml)
    fake_venice.enqueue(Behaviour(delay_before_headers=3.0))

    started = time.perf_counter()
    assert await answer(client, "fast", stream=False) == OPENAI_TEXT
    assert time.perf_counter() - started < 2.0
    assert chat_span(gateway, "fast")[sc.LLMGW_DEPLOYMENTS_TRIED] == 2


async def test_a_stream_broken_after_its_first_byte_is_never_finished_with_another_answer(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = venice_and_openai(fake_venice, fake_openai)
    toml += alias("fast", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway, client = await start(start_gateway, tmp_path, toml)
    # Cut after "Hello from fake Ven": OpenAI's "Hello from fake OpenAI!" does not begin with it.
    fake_venice.enqueue(Behaviour(drop_after_chunks=4))

    stream = await client.chat.completions.create(model="fast", messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk)
    assert received, "chunks before the drop reached the client"
    # The next deployment was asked for the rest, and began another answer: not relayed.
    assert "began differently" in caught.value.message
    assert len(fake_openai.calls("/v1/chat/completions")) == 1
    text = "".join(c.choices[0].delta.content or "" for c in received if c.choices)
    assert text == "Hello from fake Ven"
    span = chat_span(gateway, "fast")
    assert (span[sc.LLMGW_DEPLOYMENT], span[sc.LLMGW_DEPLOYMENTS_TRIED]) == (
        "openai:gpt-4o-mini",
        2,
    )
    assert span[sc.LLMGW_STREAM_OUTCOME] == "failed"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_non_retryable_answer_is_final(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    stream: bool,
) -> None:
    toml = venice_and_openai(fake_venice, fake_openai)
    toml += alias("fast", "venice:venice-nonexistent-model", "openai:gpt-4o-mini")
    _, client = await start(start_gateway, tmp_path, toml)

    with pytest.raises(openai.NotFoundError):
        await answer(client, "fast", stream=stream)
    assert fake_openai.calls("/v1/chat/completions") == []


async def test_when_every_deployment_fails_the_last_answer_is_returned(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY", max_retries=0)
    toml += provider(
        "openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY", max_retries=0
    )
    toml += alias("fast", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway, client = await start(start_gateway, tmp_path, toml)
    fake_venice.fail_times(1, status=503)
    fake_openai.fail_next(502)

    with pytest.raises(openai.APIStatusError) as caught:
        await answer(client, "fast", stream=False)
    assert caught.value.status_code == 502
    span = chat_span(gateway, "fast")
    assert (span[sc.LLMGW_DEPLOYMENT], span[sc.ERROR_TYPE]) == ("openai:gpt-4o-mini", "502")


async def test_models_lists_the_providers_that_answer_when_one_is_down(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice
) -> None:
    toml = provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY")
    toml += provider("down", "openai-compatible", f"http://127.0.0.1:{free_port()}/v1")
    _, client = await start(start_gateway, tmp_path, toml)

    ids = {model.id for model in (await client.models.list()).data}
    assert "qwen3-5-9b" in ids
    assert not any(i.startswith("down/") for i in ids)


# Capabilities: reasoning sent only where declared ------------------------------------------------

REASONING_REFUSED = frozenset({"reasoning_effort", "reasoning"})
THINKING_REQUEST = {
    "model": "qwen3-5-9b",
    "max_tokens": 512,
    "messages": [{"role": "user", "content": "think, then answer"}],
    "thinking": {"type": "adaptive"},
    "output_config": {"effort": "high"},
}


async def post_json(gateway: Gateway, path: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    key = await gateway.create_key(name="capabilities")
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gateway.url(path), json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            return response.status, response.headers, await response.json()


@pytest.mark.parametrize("stream", [False, True])
async def test_thinking_is_not_sent_to_a_provider_without_reasoning_and_the_answer_says_so(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice, stream: bool
) -> None:
    fake_venice.refused_params = REASONING_REFUSED  # as LiteLLM refused Claude Code's
    toml = provider("litellm", "openai-compatible", fake_venice.base_url, "VENICE_API_KEY")
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))

    body = {**THINKING_REQUEST, "stream": stream}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gateway.url("/v1/messages"),
            json=body,
            headers={"x-api-key": await gateway.create_key(name="claude")},
        ) as response:
            assert response.status == 200, await response.text()
            assert response.headers[OMITTED_PARAMS_HEADER] == "reasoning_effort"
            await response.read()
    assert "reasoning_effort" not in fake_venice.received[-1].json
    span = chat_span(gateway, "qwen3-5-9b")
    assert span[sc.LLMGW_OMITTED_PARAMS] == ("reasoning_effort",)


async def test_a_chat_callers_reasoning_is_dropped_for_a_provider_without_it(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice
) -> None:
    fake_venice.refused_params = REASONING_REFUSED
    toml = provider("litellm", "openai-compatible", fake_venice.base_url, "VENICE_API_KEY")
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))

    status, headers, answer = await post_json(
        gateway,
        "/v1/chat/completions",
        {
            "model": "qwen3-5-9b",
            "messages": MESSAGES,
            "reasoning_effort": "low",
            "reasoning": {"effort": "low"},
            "temperature": 0.5,
        },
    )
    assert status == 200, answer
    assert headers[OMITTED_PARAMS_HEADER] == "reasoning_effort, reasoning"
    sent = fake_venice.received[-1].json
    assert sent == {"model": "qwen3-5-9b", "messages": MESSAGES, "temperature": 0.5}
    assert chat_span(gateway, "qwen3-5-9b")[sc.LLMGW_OMITTED_PARAMS] == (
        "reasoning_effort",
        "reasoning",
    )


async def test_a_responses_callers_reasoning_is_dropped_for_a_provider_without_it(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice
) -> None:
    fake_venice.refused_params = REASONING_REFUSED  # Codex sends reasoning.effort every turn
    toml = provider("litellm", "openai-compatible", fake_venice.base_url, "VENICE_API_KEY")
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))

    body = {"model": "qwen3-5-9b", "input": "hi", "reasoning": {"effort": "high"}}
    status, headers, answer = await post_json(gateway, "/v1/responses", body)
    assert status == 200, answer
    assert headers[OMITTED_PARAMS_HEADER] == "reasoning_effort"
    assert "reasoning_effort" not in fake_venice.received[-1].json


async def test_reasoning_is_sent_where_declared_and_an_upstream_refusal_passes_through(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice
) -> None:
    toml = provider(
        "litellm", "openai-compatible", fake_venice.base_url, "VENICE_API_KEY", reasoning="true"
    )
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))
    body = {"model": "qwen3-5-9b", "messages": MESSAGES, "reasoning_effort": "low"}

    status, headers, _ = await post_json(gateway, "/v1/chat/completions", body)
    assert status == 200
    assert OMITTED_PARAMS_HEADER not in headers
    assert fake_venice.received[-1].json["reasoning_effort"] == "low"
    fake_venice.refused_params = REASONING_REFUSED
    status, _, answer = await post_json(gateway, "/v1/chat/completions", body)
    assert status == 400, "declared, so sent: the upstream's own refusal reaches the caller"
    assert answer["error"]["code"] == "unsupported_parameter"


async def test_each_deployment_of_a_route_is_sent_what_it_accepts(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY", max_retries=0)
    toml += provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("fast", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))
    body = {"model": "fast", "messages": MESSAGES, "reasoning_effort": "high"}

    status, headers, _ = await post_json(gateway, "/v1/chat/completions", body)
    assert (status, headers.get(OMITTED_PARAMS_HEADER)) == (200, None)
    fake_venice.fail_times(1, status=503)
    status, headers, _ = await post_json(gateway, "/v1/chat/completions", body)
    assert (status, headers.get(OMITTED_PARAMS_HEADER)) == (200, "reasoning_effort")
    to_venice = [r.json for r in fake_venice.chats()]
    assert [sent["reasoning_effort"] for sent in to_venice] == ["high", "high"]
    sent = fake_openai.calls("/v1/chat/completions")[-1].json
    assert sent == {"model": "gpt-4o-mini", "messages": MESSAGES}


# The providers file -------------------------------------------------------------------------------


def test_without_a_file_venice_is_the_only_provider() -> None:
    settings = load_settings({"VENICE_API_KEY": "k"})
    assert (settings.providers, settings.model_aliases) == ((), ())


async def test_each_provider_gets_its_max_connections() -> None:
    registry = await build_registry(
        load_settings({"VENICE_API_KEY": "k", "VENICE_MAX_CONNECTIONS": "7"})
    )
    try:
        assert [pool.max_connections for pool in registry.connection_pools()] == [7]
    finally:
        await registry.close()


def test_a_valid_file_is_parsed_with_keys_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        provider("venice", "venice", "https://api.venice.ai/api/v1/", "VENICE_API_KEY")
        + provider(
            "local",
            "openai-compatible",
            "http://localhost:11434/v1",
            timeout_seconds=30,
            max_retries=1,
            max_connections=64,
            headers='{ "X-Team" = "search" }',
        )
        + alias("fast", "venice:llama-3.2-3b", "local:llama3.2:3b")
    )
    settings = load_settings({"LLMGW_CONFIG": str(path), "VENICE_API_KEY": "secret-key-value"})
    venice, local = settings.providers
    assert venice == ProviderSpec(
        "venice", "venice", "https://api.venice.ai/api/v1", "VENICE_API_KEY", "secret-key-value"
    )
    assert "secret-key-value" not in repr(settings)
    assert local == ProviderSpec(
        "local",
        "openai-compatible",
        "http://localhost:11434/v1",
        timeout_seconds=30.0,
        max_retries=1,
        max_connections=64,
        headers={"X-Team": "search"},
    )
    assert settings.model_aliases == (
        ModelAlias(
            "fast",
            (DeploymentSpec("venice", "llama-3.2-3b"), DeploymentSpec("local", "llama3.2:3b")),
        ),
    )


def test_reasoning_has_a_default_per_kind_and_can_be_declared(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        provider("venice", "venice", "https://api.venice.ai/api/v1", "VENICE_API_KEY")
        + provider("litellm", "openai-compatible", "http://localhost:4000/v1")
        + provider("quiet", "venice", "http://localhost:1/v1", reasoning="false")
        + provider("o1", "openai-compatible", "http://localhost:2/v1", reasoning="true")
    )
    settings = load_settings({"LLMGW_CONFIG": str(path), "VENICE_API_KEY": "k"})
    assert [(p.name, p.capabilities.reasoning) for p in settings.providers] == [
        ("venice", True),
        ("litellm", False),
        ("quiet", False),
        ("o1", True),
    ]


def test_prefill_is_off_by_default_for_every_kind_and_can_be_declared(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        provider("venice", "venice", "https://api.venice.ai/api/v1", "VENICE_API_KEY")
        + provider("openai", "openai-compatible", "http://localhost:4000/v1")
        + provider("ollama", "openai-compatible", "http://localhost:2/v1", prefill="true")
    )
    settings = load_settings({"LLMGW_CONFIG": str(path), "VENICE_API_KEY": "k"})
    assert [(p.name, p.capabilities.prefill) for p in settings.providers] == [
        ("venice", False),
        ("openai", False),
        ("ollama", True),
    ]
    # Declaring one capability keeps the kind's default of the other.
    assert [p.capabilities.reasoning for p in settings.providers] == [True, False, False]


VENICE_OK = provider("venice", "venice", "https://api.venice.ai/api/v1", "VENICE_API_KEY")
BAD_FILES = [
    (VENICE_OK + provider("x", "foo", "http://x/v1"), 'providers[1].kind: no provider kind "foo" is installed; installed kinds: "anthropic", "azure-openai", "bedrock", "gemini", "openai-compatible", "venice", "vertex"'),
    (VENICE_OK + provider("venice", "openai-compatible", "http://x/v1"), 'providers[1].name: "venice" is already used by providers[0]'),
    (VENICE_OK + alias("fast", "venice:a", "nope:b"), 'models[0].deployments[1]: unknown provider "nope"'),
    (VENICE_OK + alias("fast", "venice"), 'models[0].deployments[0]: expected "provider:model"'),
    (VENICE_OK + provider("x", "venice", "http://x/v1", prefill='"yes"'), 'providers[1].prefill: expected true or false, got "yes"'),
    (provider("o", "openai-compatible", "http://x/v1", "UNSET_LLMGW_TEST_KEY"), "providers[0].api_key_env: environment variable UNSET_LLMGW_TEST_KEY is not set"),
    (provider("o", "openai-compatible", "ftp://x/v1"), 'providers[0].base_url: expected an http(s) URL, got "ftp://x/v1"'),
    (provider("o", "openai-compatible", "http://x/v1", colour='"blue"'), "providers[0].colour: unknown key"),
    (provider("o", "openai-compatible", "http://x/v1", max_retries=99), "providers[0].max_retries: expected an integer 0-10, got 99"),
    (provider("o", "openai-compatible", "http://x/v1", reasoning='"yes"'), 'providers[0].reasoning: expected true or false, got "yes"'),
    (provider("o", "openai-compatible", "http://x/v1", reasoning=1), "providers[0].reasoning: expected true or false, got 1"),
    (provider("o", "openai-compatible", "http://x/v1", max_retries="true"), "providers[0].max_retries: expected an integer, got true"),
    (provider("o", "openai-compatible", "http://x/v1", max_connections=0), "providers[0].max_connections: expected an integer 1-100000, got 0"),
    (provider("o", "openai-compatible", "http://x/v1", max_connections=1.5), "providers[0].max_connections: expected an integer, got 1.5"),
    (VENICE_OK + "[[models]]\ndeployments = []\n", "models[0].alias: is required"),
    ("[[providers]\n", "file: is not valid TOML"),
    (VENICE_OK + provider("x", "openai-compatible", "http://x/v1", headers='{ "X-Org" = "secret-venice-value\\r\\nX-Injected: 1" }'), "providers[1].headers.X-Org: expected a header value without control characters (CR, LF and the like)"),
    (VENICE_OK + provider("x", "openai-compatible", "http://x/v1", headers='{ "X-Org" = "secret-venice-value\\u0000" }'), "providers[1].headers.X-Org: expected a header value without control characters"),
    (VENICE_OK + provider("x", "openai-compatible", "http://x/v1", headers='{ "X Org" = "secret-venice-value" }'), "providers[1].headers.X Org: expected a header name (letters, digits and !#$%&'*+-.^_`|~)"),
    (VENICE_OK + provider("x", "openai-compatible", "http://user:secret-venice-value@x/v1"), "providers[1].base_url: holds credentials (user:password@); give the key through api_key_env or headers"),
    (VENICE_OK + provider("x", "openai-compatible", "ftp://user:secret-venice-value@x/v1"), 'providers[1].base_url: expected an http(s) URL, got "ftp://***@x/v1"'),
    (VENICE_OK + provider("x", "openai-compatible", "http://x/v1", input_usd_per_mtok="1e308", output_usd_per_mtok=1), "providers[1].input_usd_per_mtok: expected a price of 0 to 10000 USD per million tokens, got 1e+308"),
    (VENICE_OK + provider("x", "openai-compatible", "http://x/v1", input_usd_per_mtok=1, output_usd_per_mtok="nan"), "providers[1].output_usd_per_mtok: expected a price of 0 to 10000 USD per million tokens, got NaN"),
    (VENICE_OK + '[[prices]]\nmodel = "venice:*"\ninput_usd_per_mtok = 1e308\noutput_usd_per_mtok = 1\n', "prices[0].input_usd_per_mtok: expected a price of 0 to 10000 USD per million tokens, got 1e+308"),
    (VENICE_OK + '[[prices]]\nmodel = "venice:*"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = -inf\n', "prices[0].output_usd_per_mtok: expected a price of 0 to 10000 USD per million tokens, got -Infinity"),
    (VENICE_OK + '[[prices]]\nmodel = "venice:flux"\nimage_usd = 10000.01\n', "prices[0].image_usd: expected a price of 0 to 10000 USD per image, got 10000.01"),
    ("", "providers: at least one [[providers]] entry is required"),
]  # fmt: skip


def bad_file_env(tmp_path: Path, toml: str) -> dict[str, str]:
    path = tmp_path / "providers.toml"
    path.write_text(toml)
    return clean_env(
        VENICE_API_KEY="secret-venice-value", LLMGW_CONFIG=str(path), LLMGW_DATA_DIR=str(tmp_path)
    )


def assert_one_line_naming_the_entry(env: dict[str, str], message: str, stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    expected = f"llmgw: configuration error: LLMGW_CONFIG {env['LLMGW_CONFIG']}: "
    assert lines[0].startswith(expected), lines[0]
    assert message in lines[0]
    assert "secret-venice-value" not in stderr


@pytest.mark.parametrize(("toml", "message"), BAD_FILES)
def test_each_invalid_file_is_refused_with_one_line_naming_the_entry(
    serve_in_process: Callable[[dict[str, str]], int],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    toml: str,
    message: str,
) -> None:
    env = bad_file_env(tmp_path, toml)
    assert serve_in_process({k: v for k, v in env.items() if k != "BIND_ADDR"}) == 2
    assert_one_line_naming_the_entry(env, message, capsys.readouterr().err)


@pytest.mark.slow  # a process per file: the same as above, through python -m llmgw
@pytest.mark.parametrize(("toml", "message"), BAD_FILES)
def test_each_invalid_file_exits_2_with_one_line_naming_the_entry(
    tmp_path: Path, toml: str, message: str
) -> None:
    env = bad_file_env(tmp_path, toml)
    result = run_llmgw("serve", env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert_one_line_naming_the_entry(env, message, result.stderr)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"LLMGW_CONFIG .*nowhere\.toml: file: cannot be read"):
        load_settings({"LLMGW_CONFIG": str(tmp_path / "nowhere.toml")})


# A provider's max_connections: a full pool answers at once -----------------------------------


async def post_chat(
    session: aiohttp.ClientSession, gateway: Gateway, key: str, model: str = "qwen3-5-9b"
) -> aiohttp.ClientResponse:
    return await session.post(
        gateway.url("/v1/chat/completions"),
        json={"model": model, "messages": MESSAGES},
        headers={"Authorization": f"Bearer {key}"},
    )


async def venice_gauge(gateway: Gateway, name: str) -> float:
    """The value /metrics shows for provider venice's gauge ``name``."""
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url("/metrics")) as response:
            text = await response.text()
    found = re.search(rf'^{name}\{{gen_ai_provider_name="venice"[^}}]*\}} (\S+)$', text, re.M)
    assert found is not None, f"{name} is not in /metrics"
    return float(found[1])


async def hold_a_connection(
    session: aiohttp.ClientSession, gateway: Gateway, fake_venice: FakeVenice
) -> aiohttp.ClientResponse:
    """A stream that takes provider venice's one connection and keeps it until it is closed:
    its provider sends one chunk, then nothing more (a long agent turn)."""
    fake_venice.enqueue(Behaviour(stall_after_chunks=1))
    held = await session.post(
        gateway.url("/v1/chat/completions"),
        json={"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {await gateway.create_key()}"},
    )
    assert held.status == 200
    await held.content.readuntil(b"\n\n")  # its first chunk: the stream is under way
    return held


async def test_a_full_connection_pool_answers_503_with_retry_after_within_the_bounded_wait(
    start_gateway: Any,
    tmp_path: Path,
    fake_venice: FakeVenice,
    caplog: pytest.LogCaptureFixture,
) -> None:
    toml = provider(
        "venice", "venice", fake_venice.base_url, "VENICE_API_KEY", max_connections=1,
        max_retries=0,
    )  # fmt: skip
    gateway = await start_gateway(prometheus=True, **providers_settings(tmp_path, toml, **KEYS))
    key = await gateway.create_key(name="pool")
    async with aiohttp.ClientSession() as session:
        held = await hold_a_connection(session, gateway, fake_venice)
        assert await venice_gauge(gateway, "llmgw_upstream_connections_in_use") == 1
        assert await venice_gauge(gateway, "llmgw_upstream_connections_limit") == 1

        async with await post_chat(session, gateway, key) as refused:
            assert refused.status == 503
            assert refused.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
            error = (await refused.json())["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_busy")
        assert "max_connections" in error["message"]
        async with session.post(  # in the caller's API's shape
            gateway.url("/v1/messages"),
            json={"model": "qwen3-5-9b", "max_tokens": 16, "messages": MESSAGES},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        ) as refused:
            assert refused.status == 503
            assert refused.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
            assert (await refused.json())["error"]["type"] == "overloaded_error"
        # The wait is bounded, not "until a connection frees up": both answers came while the
        # stream still held the only connection (it ends only when closed, below).
        assert fake_venice.active_streams == 1 and not held.content.at_eof()
        assert await venice_gauge(gateway, "llmgw_upstream_connections_in_use") == 1
        assert len(fake_venice.received) == 1, "a refused call is never sent"
        assert "all 1 connections in use" in caplog.text

        held.close()  # the slot is given back when the stream ends
        await eventually(lambda: fake_venice.active_streams == 0)
        async with await post_chat(session, gateway, key) as later:
            assert later.status == 200
    assert await venice_gauge(gateway, "llmgw_upstream_connections_in_use") == 0
    assert await venice_gauge(gateway, "llmgw_upstream_connections_waiting") == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_alias_falls_back_when_the_first_providers_connections_are_all_in_use(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    stream: bool,
) -> None:
    toml = provider(
        "venice", "venice", fake_venice.base_url, "VENICE_API_KEY", max_connections=1
    ) + provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("fast", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway, client = await start(start_gateway, tmp_path, toml)
    async with aiohttp.ClientSession() as session:
        held = await hold_a_connection(session, gateway, fake_venice)
        assert await answer(client, "fast", stream=stream) == OPENAI_TEXT
        assert fake_venice.active_streams == 1 and not held.content.at_eof()  # still held
        assert chat_span(gateway, "fast")[sc.LLMGW_DEPLOYMENTS_TRIED] == 2
        held.close()


# Health and load balancing (issue 19) -------------------------------------------------------------

ADMIN_TOKEN = "routing-test-admin-token-51c2"
HEALTH_BACKENDS = ["postgres", REDIS]


async def routes_of(gateway: Gateway) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            gateway.url("/admin/v1/routes"), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
        return document


async def state_of(gateway: Gateway, deployment: str) -> str:
    view = await routes_of(gateway)
    (health,) = [d for d in view["deployments"] if d["deployment"] == deployment]
    state: str = health["state"]
    return state


async def _in_state(gateway: Gateway, deployment: str, state: str) -> bool:
    return await state_of(gateway, deployment) == state


async def _forget_breaker(backend: str, deployment: str) -> None:
    """Redis is not emptied between tests (Postgres is): the next test's gateways would start with
    this test's breaker state, and a change the test's moved clock dated ahead would outrank theirs
    (the newest change wins)."""
    if backend != "redis":
        return
    import redis.asyncio as aioredis

    client = aioredis.from_url(REDIS_URL)
    await client.delete(f"{CHANNEL}:open:{deployment}")
    await client.aclose()


@pytest.mark.parametrize("backend", HEALTH_BACKENDS)
async def test_two_replicas_skip_a_deployment_one_found_down_within_a_second_and_both_return(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    backend: str,
) -> None:
    """Acceptance 3: two gateways on one Postgres (or one Redis) share the primary's breaker."""
    toml = provider(
        "venice",
        "venice",
        fake_venice.base_url,
        "VENICE_API_KEY",
        max_retries=0,
        circuit_cooldown_seconds=1,
    ) + provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("sturdy", "venice:qwen3-5-9b", "openai:gpt-4o-mini")  # fmt: skip
    overrides = providers_settings(tmp_path, toml, **KEYS)
    overrides["admin_token"] = ADMIN_TOKEN
    if backend == "redis":
        overrides.update(rate_limit_backend="redis", redis_url=REDIS_URL)
    clock = Clock(time.time())  # the replicas' wall clock: the test moves it past the cooldown
    try:
        await _skip_and_return(start_gateway, overrides, clock, fake_venice)
    finally:
        await _forget_breaker(backend, "venice:qwen3-5-9b")


async def _skip_and_return(
    start_gateway: Any, overrides: dict[str, Any], clock: Clock, fake_venice: FakeVenice
) -> None:
    first: Gateway = await start_gateway(clocks=Clocks(wall=clock), **overrides)
    second: Gateway = await start_gateway(clocks=Clocks(wall=clock), **overrides)
    key = await first.create_key(name="replicas")
    first_client, second_client = first.client(key), second.client(key)
    primary = "venice:qwen3-5-9b"

    fake_venice.fail_times(FAILURES_TO_OPEN, status=503)
    for _ in range(FAILURES_TO_OPEN):
        assert await answer(first_client, "sturdy", stream=False) == OPENAI_TEXT
    assert await state_of(first, primary) == "open"
    await eventually(
        lambda: _in_state(second, primary, "open"), within=1.0, what="the second replica learns"
    )
    venice_calls = len(fake_venice.chats())  # a replica lists the models too, when it starts
    for client in (first_client, second_client):
        assert await answer(client, "sturdy", stream=True) == OPENAI_TEXT
    assert len(fake_venice.chats()) == venice_calls, "an open deployment was tried"

    # Venice recovered; after the cooldown one request probes it and both replicas return to it.
    reopens = first.server.app[app_keys.PROVIDERS].routing.health(primary).open_until
    assert reopens is not None
    clock.now = reopens - 0.01
    assert await answer(second_client, "sturdy", stream=False) == OPENAI_TEXT
    assert len(fake_venice.chats()) == venice_calls, (
        "a deployment was tried before its cooldown ended"
    )
    clock.now = reopens
    assert await answer(second_client, "sturdy", stream=False) == VENICE_TEXT
    await eventually(
        lambda: _in_state(first, primary, "closed"), within=1.0, what="the first replica learns"
    )
    for client in (first_client, second_client):
        assert await answer(client, "sturdy", stream=False) == VENICE_TEXT


@pytest.mark.parametrize("backend", HEALTH_BACKENDS)
async def test_a_replica_started_while_a_deployment_is_down_skips_it_at_once(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    backend: str,
) -> None:
    """The open breaker is kept in the store: a replica that starts after it opened knows."""
    toml = provider(
        "venice", "venice", fake_venice.base_url, "VENICE_API_KEY", max_retries=0
    ) + provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("sturdy", "venice:qwen3-5-9b", "openai:gpt-4o-mini")  # fmt: skip
    overrides = providers_settings(tmp_path, toml, **KEYS)
    overrides["admin_token"] = ADMIN_TOKEN
    if backend == "redis":
        overrides.update(rate_limit_backend="redis", redis_url=REDIS_URL)
    first: Gateway = await start_gateway(**overrides)
    key = await first.create_key(name="replicas")
    fake_venice.fail_times(FAILURES_TO_OPEN, status=503)
    try:
        for _ in range(FAILURES_TO_OPEN):
            assert await answer(first.client(key), "sturdy", stream=False) == OPENAI_TEXT
        assert await state_of(first, "venice:qwen3-5-9b") == "open"
        venice_calls = len(fake_venice.received)
        later: Gateway = await start_gateway(**overrides)
        assert await state_of(later, "venice:qwen3-5-9b") == "open"
        assert await answer(later.client(key), "sturdy", stream=False) == OPENAI_TEXT
        assert len(fake_venice.received) == venice_calls, "the started replica tried it"
    finally:
        await _forget_breaker(backend, "venice:qwen3-5-9b")


async def test_a_weighted_alias_spreads_requests_and_shows_its_routes_everywhere(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = venice_and_openai(fake_venice, fake_openai)
    toml += alias("split", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    toml += 'strategy = "weighted"\nweights = [1, 1]\n'
    overrides = providers_settings(tmp_path, toml, **KEYS)
    gateway: Gateway = await start_gateway(**overrides, admin_token=ADMIN_TOKEN, prometheus=True)
    client = gateway.client(await gateway.create_key(name="split"))
    answers = [await answer(client, "split", stream=False) for _ in range(40)]
    assert answers.count(VENICE_TEXT) >= 8 and answers.count(OPENAI_TEXT) >= 8, answers

    view = await routes_of(gateway)
    assert view["aliases"] == [
        {
            "alias": "split",
            "strategy": "weighted",
            "weights": [1.0, 1.0],
            "deployments": ["venice:qwen3-5-9b", "openai:gpt-4o-mini"],
        }
    ]
    states = {d["deployment"]: (d["state"], d["in_flight"]) for d in view["deployments"]}
    assert states == {"venice:qwen3-5-9b": ("closed", 0), "openai:gpt-4o-mini": ("closed", 0)}
    async with aiohttp.ClientSession() as session, session.get(gateway.url("/metrics")) as response:
        metrics = await response.text()
    closed = [
        line
        for line in metrics.splitlines()
        if line.startswith("llmgw_deployment_circuit_state{")
        and 'deployment="openai:gpt-4o-mini"' in line
        and 'state="closed"' in line
    ]
    assert [line.rsplit(" ", 1)[1] for line in closed] == ["1.0"], metrics


async def test_least_latency_moves_streams_to_the_deployment_that_answers_sooner(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    toml = venice_and_openai(fake_venice, fake_openai)
    toml += alias("quick", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    toml += 'strategy = "least-latency"\n'
    gateway, client = await start(start_gateway, tmp_path, toml)
    fake_venice.default_behaviour = Behaviour(delay_before_headers=0.25)
    answers = [await answer(client, "quick", stream=True) for _ in range(20)]
    # Each is measured once (Venice first, as listed), then the quicker one takes all but the
    # exploration share (one request in ten, to either).
    assert answers[:2] == [VENICE_TEXT, OPENAI_TEXT]
    assert answers.count(OPENAI_TEXT) >= 15, answers
    routing = gateway.server.app[app_keys.PROVIDERS].routing
    slow = routing.health("venice:qwen3-5-9b").latency_seconds
    quick = routing.health("openai:gpt-4o-mini").latency_seconds
    assert slow is not None and quick is not None and slow > 0.25 > quick


def test_llmgw_routes_prints_each_alias_and_deployment_state(
    gateway_processes: Any, database_url: str, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY")
        + alias("fast", "venice:qwen3-5-9b", "venice:llama-3.2-3b")
        + 'strategy = "least-latency"\n'
    )
    env = gateway_env(
        database_url, fake_venice.base_url, LLMGW_CONFIG=str(path), LLMGW_ADMIN_TOKEN=ADMIN_TOKEN
    )
    (process,) = gateway_processes(env)

    def routes_command(token: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "llmgw", "routes", "--url", f"http://127.0.0.1:{process.port}"],
            env=clean_env(LLMGW_ADMIN_TOKEN=token),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    run = routes_command(ADMIN_TOKEN)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "alias fast: least-latency: venice:qwen3-5-9b, venice:llama-3.2-3b"
    assert any(line.startswith("venice:qwen3-5-9b") and " closed " in line for line in lines)
    refused = routes_command("wrong-token-wrong-token")
    assert refused.returncode == 1
    assert "answered 401" in refused.stderr


def test_strategies_weights_and_cooldowns_are_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(
        provider("venice", "venice", "https://api.venice.ai/api/v1", "VENICE_API_KEY")
        + provider(
            "local",
            "openai-compatible",
            "http://x/v1",
            circuit_cooldown_seconds=5,
            circuit_max_failed_probes=2,
            circuit_max_cooldown_seconds=60,
            rpm=60,
            tpm=90000,
        )
        + alias("w", "venice:a", "local:b")
        + 'strategy = "weighted"\nweights = [3, 1]\n'
        + alias("busy", "venice:a", "local:b")
        + 'strategy = "least-busy"\n'
        + alias("plain", "venice:a")
    )
    settings = load_settings({"LLMGW_CONFIG": str(path), "VENICE_API_KEY": "k"})
    assert [p.circuit_cooldown_seconds for p in settings.providers] == [30.0, 5.0]
    assert [p.cooldown() for p in settings.providers] == [
        Cooldown(30.0, most=300.0, steady_probes=5),
        Cooldown(5.0, most=60.0, steady_probes=2),
    ]
    assert [(p.rpm, p.tpm) for p in settings.providers] == [(None, None), (60, 90000)]
    assert [a.strategy for a in settings.model_aliases] == [
        Strategy("weighted", (3.0, 1.0)),
        Strategy("least-busy"),
        Strategy("ordered"),
    ]


BAD_ROUTING = [
    (alias("f", "venice:a") + 'strategy = "fastest"\n', 'models[0].strategy: expected one of "ordered", "weighted", "least-busy", "least-latency", got "fastest"'),
    (alias("f", "venice:a", "venice:b") + 'strategy = "weighted"\n', 'models[0].weights: strategy = "weighted" needs one weight per deployment'),
    (alias("f", "venice:a", "venice:b") + 'strategy = "weighted"\nweights = [1]\n', "models[0].weights: expected 2 numbers >= 0 (one per deployment), got [1]"),
    (alias("f", "venice:a", "venice:b") + 'strategy = "weighted"\nweights = [1, -1]\n', "models[0].weights: expected 2 numbers"),
    (alias("f", "venice:a", "venice:b") + 'strategy = "weighted"\nweights = [0, 0]\n', "models[0].weights: at least one weight must be more than 0"),
    (alias("f", "venice:a") + "weights = [1]\n", 'models[0].weights: weights go with strategy = "weighted"'),
    (provider("o", "openai-compatible", "http://x/v1", circuit_cooldown_seconds=0), "providers[1].circuit_cooldown_seconds: expected a number of seconds, more than 0"),
    (provider("o", "openai-compatible", "http://x/v1", circuit_max_cooldown_seconds=86401), "providers[1].circuit_max_cooldown_seconds: expected a number of seconds, more than 0 and at most 86400, got 86401"),
    (provider("o", "openai-compatible", "http://x/v1", circuit_cooldown_seconds=60, circuit_max_cooldown_seconds=30), "providers[1].circuit_max_cooldown_seconds: expected at least circuit_cooldown_seconds (60.0), got 30.0"),
    (provider("o", "openai-compatible", "http://x/v1", circuit_max_failed_probes=-1), "providers[1].circuit_max_failed_probes: expected an integer 0-1000, got -1"),
    (provider("o", "openai-compatible", "http://x/v1", rpm=0), "providers[1].rpm: expected a whole number per minute, at least 1, got 0"),
    (provider("o", "openai-compatible", "http://x/v1", tpm=1.5), "providers[1].tpm: expected an integer, got 1.5"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), BAD_ROUTING)
def test_a_bad_strategy_weight_or_cooldown_names_its_entry(
    tmp_path: Path, extra: str, message: str
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(VENICE_OK + extra)
    with pytest.raises(ProviderConfigError) as raised:
        load_settings({"LLMGW_CONFIG": str(path), "VENICE_API_KEY": "k"})
    assert message in str(raised.value)


# Provider account caps (issue 19, item 7) --------------------------------------------------------


def pin_minute(gateways: list[Gateway]) -> None:
    """Every gateway counts in one minute of this test's own (counters outlive a test in the
    database), 1 s after it starts."""
    start = (math.floor(time.time() / 60) + random.randint(1, 10**6)) * 60.0
    for gateway in gateways:
        gateway.server.app[app_keys.PROVIDERS].routing.caps.clock = lambda: start + 1


def capped(fake_venice: FakeVenice, fake_openai: FakeOpenAI, **openai_caps: int) -> str:
    toml = provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY", rpm=2)
    toml += provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY", **openai_caps)  # fmt: skip
    return toml + alias("capped", "venice:qwen3-5-9b", "openai:gpt-4o-mini")


@pytest.mark.parametrize("backend", HEALTH_BACKENDS)
@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_deployment_whose_provider_is_at_its_rpm_is_skipped_for_the_next(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    replicas: int,
    backend: str,
) -> None:
    """Venice's account takes 2 requests a minute: the third goes to the next deployment, and
    Venice sees exactly 2, whichever replica (on one Postgres, or one Redis) serves each request."""
    overrides = providers_settings(tmp_path, capped(fake_venice, fake_openai), **KEYS)
    if backend == "redis":
        overrides.update(rate_limit_backend="redis", redis_url=REDIS_URL)
    gateways: list[Gateway] = [await start_gateway(**overrides) for _ in range(replicas)]
    pin_minute(gateways)
    key = await gateways[0].create_key(name="caps")
    clients = [gateway.client(key) for gateway in gateways]

    answers = [await answer(clients[i % replicas], "capped", stream=i == 2) for i in range(3)]
    assert answers == [VENICE_TEXT, VENICE_TEXT, OPENAI_TEXT]
    assert len(fake_venice.received) == 2
    assert len(fake_openai.calls("/v1/chat/completions")) == 1
    *_, third = [
        s for s in gateways[2 % replicas].telemetry.finished_spans() if s.name == "chat capped"
    ]
    span = dict(third.attributes)
    assert (span[sc.LLMGW_DEPLOYMENT], span[sc.LLMGW_DEPLOYMENTS_TRIED]) == (
        "openai:gpt-4o-mini",
        1,
    ), "a capped deployment is not tried: nothing was sent to it"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tpm_reservation_is_settled_at_the_tokens_the_answer_used(
    start_gateway: Any,
    tmp_path: Path,
    fake_openai: FakeOpenAI,
    fake_venice: FakeVenice,
    stream: bool,
) -> None:
    """Each request reserves its worst case (4096 output tokens by default) on Venice's 6000 a
    minute; settled at what it used, the minute has room for the next ones."""
    toml = provider("venice", "venice", fake_venice.base_url, "VENICE_API_KEY", tpm=6000)
    toml += provider("openai", "openai-compatible", fake_openai.base_url, "OPENAI_API_KEY")
    toml += alias("capped", "venice:qwen3-5-9b", "openai:gpt-4o-mini")
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))
    pin_minute([gateway])
    key = await gateway.create_key(name="settled")
    client = gateway.client(key)
    limits = gateway.server.app[app_keys.LIMITS]
    for _ in range(3):
        assert await answer(client, "capped", stream=stream) == VENICE_TEXT
        assert await limits.flush()  # the settlements queued when each request ended
    assert len(fake_openai.calls("/v1/chat/completions")) == 0, "a worst case was left held"
    minute = math.floor(gateway.server.app[app_keys.PROVIDERS].routing.caps.clock() / 60) * 60
    used, reserved = await limits.store.usage(f"provider-tokens:venice:{minute:.0f}")
    assert await gateway.server.app[app_keys.LEDGER].flush()
    billed = await gateway.db.fetchval("SELECT sum(input_tokens + output_tokens) FROM usage_events")
    assert (used, reserved) == (billed, 0)


async def test_when_every_provider_is_at_its_cap_the_caller_gets_429_with_retry_after(
    start_gateway: Any, tmp_path: Path, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> None:
    overrides = providers_settings(tmp_path, capped(fake_venice, fake_openai, rpm=1), **KEYS)
    gateway: Gateway = await start_gateway(**overrides)
    pin_minute([gateway])
    key = await gateway.create_key(name="capped-out")
    client = gateway.client(key)
    for _ in range(3):
        await answer(client, "capped", stream=False)

    # Chat completions, streamed or not: OpenAI's error shape.
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as refused:
            await answer(client, "capped", stream=stream)
        assert refused.value.response.headers["Retry-After"] == "59"
        assert refused.value.code == "provider_capacity_exceeded"
        assert "account limit" in refused.value.message
    # Anthropic Messages: Anthropic's.
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gateway.url("/v1/messages"),
            json={"model": "capped", "max_tokens": 16, "messages": MESSAGES},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        ) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "59"
            document = await response.json()
    assert document["type"] == "error"
    assert document["error"]["type"] == "rate_limit_error"
    assert len(fake_venice.chats()) == 2
    assert len(fake_openai.calls("/v1/chat/completions")) == 1
