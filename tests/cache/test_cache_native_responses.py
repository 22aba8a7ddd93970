"""A native ``/v1/responses`` (a route whose providers serve Responses themselves) cached: the
openai SDK through a real gateway to the fake OpenAI's own /v1/responses, on memory and on Redis.
An answer stored in one form is replayed in both, every item as the provider sent it (reasoning
and its summary, function calls, text), through the SDK's own stream accumulator; only a complete
answer of a request that neither stores nor continues state is kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw import app_keys
from llmgw.config import load_settings
from llmgw.config.providers_file import ProviderSpec
from llmgw.providers.plugin import Capabilities
from tests.cache.test_cache_requests import BACKENDS
from tests.conftest import Gateway
from tests.fake_openai import FAKE_OPENAI_KEY, REASONING_SUMMARY, FakeOpenAI
from tests.fake_venice import FAKE_VENICE_KEY, TOOL_ARGUMENTS, FakeVenice
from tests.test_responses_api import TOOLS, ledger_rows

MODEL = "gpt"
TEXT = {"model": MODEL, "input": "Say hello", "store": False}
CUT_SHORT = {**TEXT, "max_output_tokens": 1}  # below the reply: an incomplete response
CALL = {
    "model": MODEL,
    "input": "Add 4 and 6",
    "tools": TOOLS,
    "reasoning": {"effort": "low", "summary": "auto"},
    "store": False,
}


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(chunks=5) as fake:
        yield fake


@pytest.fixture(params=BACKENDS)
async def gateway(
    request: pytest.FixtureRequest, start_gateway: Any, fake_openai: FakeOpenAI, tmp_path: Path
) -> Gateway:
    toml = f"""
[[providers]]
name = "openai"
kind = "openai-compatible"
base_url = "{fake_openai.base_url}"
api_key_env = "OPENAI_API_KEY"
responses = "native"

[[models]]
alias = "{MODEL}"
deployments = ["openai:gpt-4o-mini"]

[[prices]]
model = "openai:gpt-4o-mini"
input_usd_per_mtok = 2
output_usd_per_mtok = 8
"""
    path = tmp_path / "llmgw.toml"
    path.write_text(toml)
    settings = load_settings({"LLMGW_CONFIG": str(path), "OPENAI_API_KEY": FAKE_OPENAI_KEY})
    gateway: Gateway = await start_gateway(
        providers=settings.providers,
        model_aliases=settings.model_aliases,
        prices=settings.prices,
        upstream_max_retries=0,
        **request.param,
    )
    return gateway


async def _json(client: openai.AsyncOpenAI, ask: dict[str, Any]) -> tuple[str, Any]:
    raw = await client.responses.with_raw_response.create(**ask)
    return raw.headers["x-llmgw-cache"], raw.parse()


async def _streamed(client: openai.AsyncOpenAI, ask: dict[str, Any]) -> tuple[str, Any]:
    async with client.responses.with_streaming_response.create(**ask, stream=True) as raw:
        result = raw.headers["x-llmgw-cache"]
        events = [event async for event in await raw.parse()]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    final = events[-1].response
    assert {event.response.id for event in events if hasattr(event, "response")} == {final.id}
    # What the deltas make is what the final response says.
    assert _joined(events, "response.output_text.delta") == final.output_text
    calls = [item.arguments for item in final.output if item.type == "function_call"]
    assert _joined(events, "response.function_call_arguments.delta") == "".join(calls)
    summaries = [s.text for item in final.output if item.type == "reasoning" for s in item.summary]
    assert _joined(events, "response.reasoning_summary_text.delta") == "".join(summaries)
    return result, final


def _joined(events: list[Any], kind: str) -> str:
    return "".join(event.delta for event in events if event.type == kind)


def _same(a: Any, b: Any) -> None:
    assert [_sent(item) for item in a.output] == [_sent(item) for item in b.output]
    assert (a.status, a.output_text, a.model) == (b.status, b.output_text, b.model)
    assert a.usage.model_dump() == b.usage.model_dump()


def _sent(item: Any) -> dict[str, Any]:
    """An output item as it was sent, without what the SDK's stream adds to it (its own parse
    of a text or a strict tool's arguments)."""
    dumped: dict[str, Any] = item.model_dump(exclude_none=True)
    dumped.pop("parsed_arguments", None)
    return dumped


async def _stored(gateway: Gateway) -> None:
    """A Redis write lands after the answer was sent: every write under way has landed."""
    await gateway.server.app[app_keys.CACHE].drained()


@pytest.mark.parametrize("ask", [TEXT, CALL], ids=["text", "reasoning-and-call"])
@pytest.mark.parametrize("first", [_json, _streamed], ids=["stored-as-json", "stored-as-stream"])
async def test_a_native_response_is_replayed_in_both_forms(
    gateway: Gateway, fake_openai: FakeOpenAI, first: Any, ask: dict[str, Any]
) -> None:
    client = gateway.client(await gateway.create_key())
    result, answer = await first(client, ask)
    assert result == "miss"
    if ask is CALL:
        assert [item.type for item in answer.output] == ["reasoning", "function_call"]
        assert answer.output[0].summary[0].text == REASONING_SUMMARY
        assert answer.output[1].arguments == TOOL_ARGUMENTS
    else:
        assert answer.output_text == fake_openai.reply
    await _stored(gateway)
    for form in (_json, _streamed):
        result, again = await form(client, ask)
        assert result == "hit"
        _same(again, answer)
        assert again.id != answer.id  # each answer is the gateway's own response
    assert len(fake_openai.calls("/v1/responses")) == 1


@pytest.mark.parametrize("first", [_json, _streamed], ids=["stored-as-json", "stored-as-stream"])
async def test_venices_own_responses_are_cached_too(
    start_gateway: Any, fake_venice: FakeVenice, first: Any
) -> None:
    """Venice's stream is data-only frames and a final ``[DONE]``: replayed as OpenAI's."""
    spec = ProviderSpec(
        name="venice",
        kind="venice",
        base_url=fake_venice.base_url,
        api_key=FAKE_VENICE_KEY,
        capabilities=Capabilities(native_responses=True),
    )
    gateway: Gateway = await start_gateway(providers=(spec,), cache="memory")
    client = gateway.client(await gateway.create_key())
    ask = {"model": "qwen3-5-9b", "input": "4 + 6?", "tools": TOOLS, "store": False}
    result, answer = await first(client, ask)
    assert result == "miss" and answer.output[0].arguments == TOOL_ARGUMENTS
    for form in (_json, _streamed):
        result, again = await form(client, ask)
        assert result == "hit"
        _same(again, answer)
    assert len([r for r in fake_venice.received if r.path == "/api/v1/responses"]) == 1


async def test_a_request_that_stores_or_continues_state_bypasses(
    gateway: Gateway, fake_openai: FakeOpenAI
) -> None:
    client = gateway.client(await gateway.create_key())
    stored = {**TEXT, "store": True}
    result, first = await _json(client, stored)
    assert result == "bypass"
    await _stored(gateway)
    result, _ = await _streamed(client, stored)
    assert result == "bypass"
    continued = {**TEXT, "previous_response_id": first.id}
    for form in (_json, _json, _streamed):
        result, _ = await form(client, continued)
        assert result == "bypass"
        await _stored(gateway)
    assert len(fake_openai.calls("/v1/responses")) == 5


@pytest.mark.parametrize("form", [_json, _streamed], ids=["json", "stream"])
async def test_an_incomplete_or_failed_response_is_not_stored(
    gateway: Gateway, fake_openai: FakeOpenAI, form: Any
) -> None:
    client = gateway.client(await gateway.create_key())
    if form is _json:
        for _ in range(2):
            result, answer = await _json(client, CUT_SHORT)
            assert (result, answer.status) == ("miss", "incomplete")
            await _stored(gateway)
    else:
        for _ in range(2):
            async with client.responses.with_streaming_response.create(
                **CUT_SHORT, stream=True
            ) as raw:
                assert raw.headers["x-llmgw-cache"] == "miss"
                kinds = [event.type async for event in await raw.parse()]
            assert kinds[-1] == "response.incomplete"
            await _stored(gateway)
    fake_openai.fail_next(400)
    with pytest.raises(openai.BadRequestError):
        await form(client, TEXT)
    await _stored(gateway)
    result, _ = await form(client, TEXT)
    assert result == "miss"
    assert len(fake_openai.calls("/v1/responses")) == 4


async def test_a_streamed_follower_of_an_incomplete_stream_gets_its_end(
    gateway: Gateway, fake_openai: FakeOpenAI
) -> None:
    """It was sent the leader's events as they came: it gets the same end, not an error, and
    the answer is not kept."""
    client = gateway.client(await gateway.create_key())
    fake_openai.end_held = asyncio.Event()
    async with client.responses.stream(**CUT_SHORT) as leader:
        first = await anext(leader)
        async with client.responses.with_streaming_response.create(**CUT_SHORT, stream=True) as raw:
            assert raw.headers["x-llmgw-cache"] == "hit"
            follower = await raw.parse()
            assert (await anext(follower)).type == first.type == "response.created"
            fake_openai.end_held.set()
            followed = [event.type async for event in follower]
        led = [event.type async for event in leader]
    assert followed == led and led[-1] == "response.incomplete"
    await _stored(gateway)
    result, _ = await _json(client, CUT_SHORT)
    assert result == "miss"
    assert len(fake_openai.calls("/v1/responses")) == 2


async def test_a_hits_ledger_row_costs_nothing_and_says_what_it_saved(
    gateway: Gateway, fake_openai: FakeOpenAI
) -> None:
    client = gateway.client(await gateway.create_key())
    await _streamed(client, CALL)
    await _stored(gateway)
    await _json(client, CALL)
    miss, hit = await ledger_rows(gateway)
    assert not miss["cache_hit"] and miss["cost_usd"] > 0
    assert hit["cache_hit"] and hit["cost_usd"] == 0
    assert hit["saved_cost_usd"] == miss["cost_usd"]
    tokens = ("input_tokens", "output_tokens", "reasoning_output_tokens")
    assert [hit[name] for name in tokens] == [miss[name] for name in tokens]
    assert len(fake_openai.calls("/v1/responses")) == 1
