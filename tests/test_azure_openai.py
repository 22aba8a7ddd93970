"""``kind = "azure-openai"`` end to end: the openai SDK through a gateway to the fake Azure resource
(tests/fake_azure.py), over both URL schemes; content filtering, rate limits, exact cost, and routes
that mix Azure and Venice deployments (issue #20, acceptance 2 and 3 for Azure)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from llmgw import app_keys
from llmgw.config import load_settings
from llmgw.config.providers_file import ProviderConfigError, ProviderSpec, load_provider_config
from llmgw.providers.azure_openai import PLUGIN, AzureOptions
from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway
from tests.fake_azure import (
    FAKE_AZURE_KEY,
    GA_API_VERSION,
    OUTPUT_FILTERED,
    PROMPT_FILTER_RESULTS,
    PROMPT_FILTERED,
    PROMPT_FILTERED_BODY,
    STREAM_DROPPED,
    FakeAzure,
    RateLimited,
)
from tests.fake_openai import providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.secrets_scan import SecretScanner
from tests.test_providers_routing import alias, chat_span, provider

AZURE_TEXT = "Hello from fake Azure!"
VENICE_TEXT = "Hello from fake Venice!"
KEYS = {"AZURE_OPENAI_API_KEY": FAKE_AZURE_KEY, "VENICE_API_KEY": FAKE_VENICE_KEY}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
    },
}
# Where each scheme sends a chat completion for the deployment "prod-chat".
CHAT_PATHS = {
    "classic": f"/openai/deployments/prod-chat/chat/completions?api-version={GA_API_VERSION}",
    "v1": "/openai/v1/chat/completions",
}


@pytest.fixture(autouse=True)
def azure_key_is_a_secret(secret_scanner: SecretScanner) -> None:
    """The suite's scan fails a test in which the Azure key shows up in a log, span or answer."""
    secret_scanner.register(FAKE_AZURE_KEY, "the fake Azure key")


@pytest.fixture
async def fake_azure() -> AsyncIterator[FakeAzure]:
    async with FakeAzure() as fake:
        yield fake


def azure(fake: FakeAzure, scheme: str = "v1", name: str = "azure", **extra: Any) -> str:
    if scheme == "classic":
        extra["api_version"] = f'"{GA_API_VERSION}"'
    return provider(name, "azure-openai", fake.endpoint, "AZURE_OPENAI_API_KEY", **extra)


def venice(fake: FakeVenice, **extra: Any) -> str:
    return provider("venice", "venice", fake.base_url, "VENICE_API_KEY", **extra)


async def start(start_gateway: Any, tmp_path: Path, toml: str) -> tuple[Gateway, str]:
    gateway: Gateway = await start_gateway(**providers_settings(tmp_path, toml, **KEYS))
    return gateway, await gateway.create_key(name="azure")


@pytest.fixture(params=["classic", "v1"])
async def through(
    request: pytest.FixtureRequest, start_gateway: Any, tmp_path: Path, fake_azure: FakeAzure
) -> tuple[Gateway, openai.AsyncOpenAI, str]:
    """A gateway whose first provider is the fake Azure resource, in one scheme or the other."""
    scheme: str = request.param
    gateway, key = await start(start_gateway, tmp_path, azure(fake_azure, scheme))
    return gateway, gateway.client(key), scheme


# The openai SDK through the gateway, both schemes ------------------------------------------------


async def test_chat_reaches_the_deployment_with_api_key_and_keeps_the_filter_results(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure
) -> None:
    gateway, client, scheme = through
    completion = await client.chat.completions.create(model="prod-chat", messages=MESSAGES)

    assert completion.choices[0].message.content == AZURE_TEXT
    assert completion.model == "gpt-4o-2024-11-20", "Azure names the model, not the deployment"
    # Azure's filter verdicts reach the caller as Azure sent them.
    assert (completion.model_extra or {})["prompt_filter_results"] == PROMPT_FILTER_RESULTS
    assert completion.choices[0].model_extra["content_filter_results"]["hate"]["filtered"] is False
    [sent] = fake_azure.received
    assert sent.path == CHAT_PATHS[scheme]
    assert sent.headers["api-key"] == FAKE_AZURE_KEY
    assert "authorization" not in sent.headers, "the caller's key never reaches the provider"
    assert sent.json["model"] == "prod-chat"
    span = chat_span(gateway, "prod-chat")
    assert span[sc.GEN_AI_PROVIDER_NAME] == "azure"
    assert span[sc.SERVER_PORT] == fake_azure.port
    assert span[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4


async def test_stream_skips_nothing_and_counts_the_usage_chunk(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure
) -> None:
    gateway, client, scheme = through
    stream = await client.chat.completions.create(model="prod-chat", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]

    # Azure's first chunk (no choices, a blank id, the prompt's verdicts) is relayed as it came.
    assert chunks[0].choices == [] and chunks[0].id == ""
    assert (chunks[0].model_extra or {})["prompt_filter_results"] == PROMPT_FILTER_RESULTS
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == AZURE_TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    [sent] = fake_azure.received
    assert sent.path == CHAT_PATHS[scheme]
    assert sent.json["stream_options"] == {"include_usage": True}, "the gateway asks for usage"
    assert [c.usage for c in chunks if c.usage is not None] == [], "the caller did not ask for it"
    assert chat_span(gateway, "prod-chat")[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_tools_over_two_turns(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure, stream: bool
) -> None:
    _, client, scheme = through
    messages: list[Any] = [{"role": "user", "content": "What is 4 + 6?"}]
    if stream:
        chunks = await client.chat.completions.create(
            model="prod-chat", messages=messages, tools=[ADD_TOOL], stream=True
        )
        calls: dict[str, str] = {}
        call_id = ""
        async for chunk in chunks:
            for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                call_id = delta_call.id or call_id
                arguments = delta_call.function.arguments if delta_call.function else ""
                calls[call_id] = calls.get(call_id, "") + (arguments or "")
        [(call_id, arguments)] = calls.items()
    else:
        first = await client.chat.completions.create(
            model="prod-chat", messages=messages, tools=[ADD_TOOL]
        )
        assert first.choices[0].finish_reason == "tool_calls"
        [tool_call] = first.choices[0].message.tool_calls or []
        call_id, arguments = tool_call.id, tool_call.function.arguments  # type: ignore[union-attr]
    assert json.loads(arguments) == {"a": 4, "b": 6}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "10"},
    ]
    second = await client.chat.completions.create(
        model="prod-chat", messages=messages, tools=[ADD_TOOL]
    )
    assert second.choices[0].message.content == AZURE_TEXT
    assert [r.path for r in fake_azure.received] == [CHAT_PATHS[scheme]] * 2
    assert fake_azure.received[1].json["messages"][-1] == messages[-1]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_responses_are_translated_to_chat_for_azure(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure, stream: bool
) -> None:
    _, client, scheme = through
    if stream:
        events = await client.responses.create(
            model="prod-chat", input="What is the capital of France?", stream=True
        )
        done = [e async for e in events if e.type == "response.completed"]
        response = done[0].response
    else:
        response = await client.responses.create(
            model="prod-chat", input="What is the capital of France?"
        )
    assert response.output_text == AZURE_TEXT
    assert response.status == "completed"
    assert response.usage is not None and response.usage.output_tokens == 4
    [sent] = fake_azure.received
    assert sent.path == CHAT_PATHS[scheme]
    assert sent.json["messages"][-1] == {
        "role": "user",
        "content": "What is the capital of France?",
    }


async def test_embeddings_go_to_the_deployment(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure
) -> None:
    _, client, scheme = through
    result = await client.embeddings.create(model="embed-small", input=["one", "two"])
    assert len(result.data) == 2
    path = {
        "classic": f"/openai/deployments/embed-small/embeddings?api-version={GA_API_VERSION}",
        "v1": "/openai/v1/embeddings",
    }
    assert [r.path for r in fake_azure.received] == [path[scheme]]


# Content filtering -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_filtered_prompt_reaches_the_caller_after_one_attempt(
    start_gateway: Any,
    tmp_path: Path,
    fake_azure: FakeAzure,
    fake_venice: FakeVenice,
    stream: bool,
) -> None:
    # A second deployment, of another kind, that must not be asked: a refusal is the answer.
    toml = azure(fake_azure, "classic") + venice(fake_venice)
    toml += alias("safe", "azure:prod-chat", "venice:qwen3-5-9b")
    gateway, key = await start(start_gateway, tmp_path, toml)
    fake_azure.fail_next(PROMPT_FILTERED)
    venice_calls = len(fake_venice.received)

    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.client(key).chat.completions.create(
            model="safe", messages=MESSAGES, stream=stream
        )

    assert refused.value.status_code == 400
    assert refused.value.code == "content_filter"
    assert refused.value.param == "prompt"
    assert refused.value.body == PROMPT_FILTERED_BODY["error"], "Azure's reason, as it sent it"
    assert len(fake_azure.received) == 1, "never retried"
    assert len(fake_venice.received) == venice_calls, "never sent to another model"


async def test_a_filtered_answer_keeps_its_finish_reason_and_verdicts(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure
) -> None:
    _, client, _ = through
    fake_azure.fail_next(OUTPUT_FILTERED, OUTPUT_FILTERED)
    completion = await client.chat.completions.create(model="prod-chat", messages=MESSAGES)
    assert completion.choices[0].finish_reason == "content_filter"
    verdicts = completion.choices[0].model_extra["content_filter_results"]
    assert verdicts["violence"] == {"filtered": True, "severity": "high"}

    stream = await client.chat.completions.create(model="prod-chat", messages=MESSAGES, stream=True)
    finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert finishes[-1] == "content_filter"
    assert len(fake_azure.received) == 2, "a filtered answer is an answer: not asked again"


async def test_a_filtered_prompt_reaches_a_messages_caller_in_anthropic_shape(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure
) -> None:
    gateway, client, _ = through
    fake_azure.fail_next(PROMPT_FILTERED)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url("/v1/messages"),
            json={"model": "prod-chat", "max_tokens": 64, "messages": MESSAGES},
            headers={"x-api-key": client.api_key, "anthropic-version": "2023-06-01"},
        )
        body = await response.json()
    assert response.status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "content management policy" in body["error"]["message"]
    assert len(fake_azure.received) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_on_your_data_is_refused_before_azure_is_asked(
    through: tuple[Gateway, openai.AsyncOpenAI, str], fake_azure: FakeAzure, stream: bool
) -> None:
    _, client, _ = through
    # Azure would query this index with the resource's own identity: the operator's data.
    data_sources = [
        {
            "type": "azure_search",
            "parameters": {
                "endpoint": "https://search.example.net",
                "index_name": "hr-records",
                "authentication": {"type": "system_assigned_managed_identity"},
            },
        }
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model="prod-chat",
            messages=MESSAGES,
            stream=stream,
            extra_body={"data_sources": data_sources},
        )
    assert refused.value.param == "data_sources"
    assert fake_azure.received == []
    # The name elsewhere in the body (a tool's parameter) is no data source.
    tool = {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"data_sources": {"type": "array"}}},
        },
    }
    completion = await client.chat.completions.create(
        model="prod-chat", messages=MESSAGES, tools=[tool]
    )
    assert completion.choices[0].finish_reason == "tool_calls"
    assert len(fake_azure.received) == 1


# Rate limits -------------------------------------------------------------------------------------


async def test_a_429_is_retried_after_its_retry_after_ms(
    start_gateway: Any, tmp_path: Path, fake_azure: FakeAzure
) -> None:
    gateway, key = await start(start_gateway, tmp_path, azure(fake_azure, "classic"))
    # retry-after says 2 s (whole seconds), retry-after-ms 1.1 s: the finer one is waited.
    fake_azure.fail_next(RateLimited(retry_after_ms=1100))

    completion = await gateway.client(key).chat.completions.create(
        model="prod-chat", messages=MESSAGES
    )

    assert completion.choices[0].message.content == AZURE_TEXT
    first, second = fake_azure.received
    assert second.headers["api-key"] == FAKE_AZURE_KEY
    assert 1.1 <= second.at - first.at < 2.0, "waited retry-after-ms, not retry-after"


# Cost --------------------------------------------------------------------------------------------

# As Azure reports an o-series answer's usage (Z5): cached input and reasoning inside the totals.
AZURE_USAGE = {
    "completion_tokens": 6_789,
    "completion_tokens_details": {"reasoning_tokens": 5_003},
    "prompt_tokens": 123_457,
    "prompt_tokens_details": {"cached_tokens": 100_003},
    "total_tokens": 130_246,
}
AZURE_PRICES = """
[[prices]]
model = "azure:prod-*"
input_usd_per_mtok = 1.1
output_usd_per_mtok = 4.4
cache_read_usd_per_mtok = 0.275
reasoning_usd_per_mtok = 8.8
"""
AZURE_BILL = (
    (123_457 - 100_003) * Decimal("1.1")
    + 100_003 * Decimal("0.275")
    + (6_789 - 5_003) * Decimal("4.4")
    + 5_003 * Decimal("8.8")
) / 1_000_000


async def test_azure_answers_are_billed_at_their_configured_prices_exactly(
    start_gateway: Any, tmp_path: Path, fake_azure: FakeAzure
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(azure(fake_azure, "classic") + AZURE_PRICES)
    settings = load_settings({"LLMGW_CONFIG": str(path), **KEYS})
    gateway: Gateway = await start_gateway(
        providers=settings.providers, model_aliases=settings.model_aliases, prices=settings.prices
    )
    client = gateway.client(await gateway.create_key(name="priced"))
    fake_azure.usage = AZURE_USAGE

    await client.chat.completions.create(model="prod-chat", messages=MESSAGES)
    stream = await client.chat.completions.create(model="prod-chat", messages=MESSAGES, stream=True)
    _ = [chunk async for chunk in stream]
    await client.responses.create(model="prod-chat", input="hi")

    assert await gateway.server.app[app_keys.LEDGER].flush()
    rows = await gateway.db.fetch("SELECT * FROM usage_events ORDER BY id")
    assert [row["cost_usd"] for row in rows] == [AZURE_BILL] * 3
    assert {(row["provider"], row["cache_read_input_tokens"]) for row in rows} == {
        ("azure", 100_003)
    }
    assert {row["reasoning_output_tokens"] for row in rows} == {5_003}


# Routes across kinds -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_alias_of_azure_and_venice_deployments_falls_back_across_kinds(
    start_gateway: Any,
    tmp_path: Path,
    fake_azure: FakeAzure,
    fake_venice: FakeVenice,
    stream: bool,
) -> None:
    toml = azure(fake_azure, "classic", max_retries=0) + azure(fake_azure, "v1", name="azure-v1")
    toml += venice(fake_venice, max_retries=0)
    toml += alias("mixed", "azure:prod-chat", "venice:qwen3-5-9b", "azure-v1:backup-chat")
    gateway, key = await start(start_gateway, tmp_path, toml)
    client = gateway.client(key)

    async def answer() -> str:
        if not stream:
            completion = await client.chat.completions.create(model="mixed", messages=MESSAGES)
            return completion.choices[0].message.content or ""
        chunks = await client.chat.completions.create(model="mixed", messages=MESSAGES, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    # Azure (classic) overloaded: Venice answers.
    fake_azure.fail_next(503)
    assert await answer() == VENICE_TEXT
    assert chat_span(gateway, "mixed")[sc.LLMGW_DEPLOYMENT] == "venice:qwen3-5-9b"
    # Both down: the last deployment, Azure over v1 with another deployment, answers.
    gateway.telemetry.spans.clear()
    fake_azure.fail_next(503)
    fake_venice.enqueue(Behaviour(status=503))
    assert await answer() == AZURE_TEXT
    span = chat_span(gateway, "mixed")
    assert (span[sc.LLMGW_DEPLOYMENT], span[sc.LLMGW_DEPLOYMENTS_TRIED]) == (
        "azure-v1:backup-chat",
        3,
    )
    assert span[sc.GEN_AI_PROVIDER_NAME] == "azure-v1"
    assert [r.path.partition("?")[0] for r in fake_azure.received] == [
        "/openai/deployments/prod-chat/chat/completions",
        "/openai/deployments/prod-chat/chat/completions",
        "/openai/v1/chat/completions",
    ]
    assert fake_azure.received[-1].json["model"] == "backup-chat"


@pytest.mark.parametrize("finisher", ["venice", "azure"])
async def test_an_azure_stream_cut_mid_answer_is_finished_by_the_next_deployment(
    start_gateway: Any,
    tmp_path: Path,
    fake_azure: FakeAzure,
    fake_venice: FakeVenice,
    finisher: str,
) -> None:
    # Venice's answer begins as Azure's did ("Hello from f"), so its restart extends the text
    # already relayed; with Azure alone, Azure itself is asked again.
    toml = azure(fake_azure, "classic") + venice(fake_venice)
    toml += alias("mixed", "azure:prod-chat", "venice:qwen3-5-9b")
    toml += alias("azure-only", "azure:prod-chat")
    gateway, key = await start(start_gateway, tmp_path, toml)
    model = "mixed" if finisher == "venice" else "azure-only"
    fake_azure.fail_next(STREAM_DROPPED)

    stream = await gateway.client(key).chat.completions.create(
        model=model, messages=MESSAGES, stream=True
    )
    chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == {"venice": VENICE_TEXT, "azure": AZURE_TEXT}[finisher]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f is not None] == ["stop"], "one answer, one finish"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    assert [c.id for c in chunks if not c.choices] == [""], "Azure's opening chunk, once"
    assert len(fake_azure.received) == (1 if finisher == "venice" else 2)


async def test_models_lists_no_azure_ids_only_the_aliases_and_asks_azure_nothing(
    start_gateway: Any, tmp_path: Path, fake_azure: FakeAzure, fake_venice: FakeVenice
) -> None:
    toml = venice(fake_venice) + azure(fake_azure) + alias("gpt", "azure:prod-chat")
    gateway, key = await start(start_gateway, tmp_path, toml)
    ids = {model.id for model in (await gateway.client(key).models.list()).data}
    assert "gpt" in ids and "qwen3-5-9b" in ids
    assert not any(i.startswith("azure/") for i in ids)
    assert fake_azure.received == []


# The provider's keys ------------------------------------------------------------------------------


def load(tmp_path: Path, toml: str) -> ProviderSpec:
    path = tmp_path / "llmgw.toml"
    path.write_text(toml)
    (spec,) = load_provider_config(path, KEYS).providers
    return spec


def test_api_version_is_read_for_azure_and_v1_is_the_default(tmp_path: Path) -> None:
    endpoint = "https://example-resource.openai.azure.com"
    toml = provider("azure", "azure-openai", endpoint, "AZURE_OPENAI_API_KEY")
    assert load(tmp_path, toml).options == AzureOptions(api_version=None)
    spec = load(tmp_path, toml + 'api_version = "2025-04-01-preview"\n')
    assert (spec.kind, spec.options) == ("azure-openai", AzureOptions("2025-04-01-preview"))
    assert spec.capabilities == PLUGIN.capabilities
    assert load(tmp_path, toml + "reasoning = true\n").capabilities.reasoning is True


@pytest.mark.parametrize(
    ("kind", "value", "problem"),
    [
        (
            "openai-compatible",
            '"2024-10-21"',
            'providers[0].api_version: applies only to kind = "azure-openai" '
            '(this provider is "openai-compatible")',
        ),
        ("venice", '"2024-10-21"', 'applies only to kind = "azure-openai"'),
        ("azure-openai", '"2024-10-21&x=1"', 'expected an Azure api-version such as "2024-10-21"'),
        ("azure-openai", '""', "expected an Azure api-version"),
        ("azure-openai", "20241021", "providers[0].api_version: expected a string"),
    ],
)
def test_a_misplaced_or_malformed_api_version_is_refused_naming_the_entry(
    tmp_path: Path, kind: str, value: str, problem: str
) -> None:
    toml = provider("p", kind, "https://example.test", "AZURE_OPENAI_API_KEY")
    with pytest.raises(ProviderConfigError) as refused:
        load(tmp_path, toml + f"api_version = {value}\n")
    assert problem in str(refused.value)
