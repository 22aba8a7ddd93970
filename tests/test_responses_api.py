"""POST/GET/DELETE /v1/responses through the official openai SDK, against a provider that serves
Responses itself (the fake Venice's /responses) and one that only speaks chat (the fake OpenAI)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from llmgw import app_keys
from llmgw.config.providers_file import ProviderConfigError, ProviderSpec, load_provider_config
from llmgw.providers.plugin import Capabilities
from tests.conftest import Gateway, eventually
from tests.fake_openai import FAKE_OPENAI_KEY, FakeOpenAI
from tests.fake_venice import FAKE_VENICE_KEY, TOOL_ARGUMENTS, Behaviour, FakeVenice
from tests.processes import clean_env

VENICE_TEXT = "Hello from fake Venice!"
OPENAI_TEXT = "Hello from fake OpenAI!"
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        "strict": True,
    }
]


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


class Upstream:
    """Which provider a test runs against, and how to read what it was sent."""

    def __init__(self, gateway: Gateway, kind: str, fake_openai: FakeOpenAI) -> None:
        self.gateway = gateway
        self.kind = kind
        self.fake_openai = fake_openai

    @property
    def reply(self) -> str:
        return VENICE_TEXT if self.kind == "native" else OPENAI_TEXT

    def sent(self) -> list[Any]:
        """The bodies the provider received for Responses calls, in order."""
        if self.kind == "native":
            return [r.json for r in self.gateway.fake.received if r.path == "/api/v1/responses"]
        return [r.json for r in self.fake_openai.calls("/v1/chat/completions")]


@pytest.fixture(params=["native", "chat-only"])
async def upstream(
    request: Any, start_gateway: Any, fake_openai: FakeOpenAI, fake_venice: FakeVenice
) -> Upstream:
    if request.param == "native":
        spec = ProviderSpec(
            name="venice",
            kind="venice",
            base_url=fake_venice.base_url,
            api_key=FAKE_VENICE_KEY,
            capabilities=Capabilities(reasoning=True, native_responses=True),
        )
    else:
        spec = chat_only(fake_openai)
    gateway: Gateway = await start_gateway(providers=(spec,))
    return Upstream(gateway, request.param, fake_openai)


def chat_only(fake_openai: FakeOpenAI) -> ProviderSpec:
    return ProviderSpec(
        name="openai",
        kind="openai-compatible",
        base_url=fake_openai.base_url,
        api_key=FAKE_OPENAI_KEY,
    )


async def client_for(upstream: Upstream, **key_settings: Any) -> openai.AsyncOpenAI:
    return upstream.gateway.client(await upstream.gateway.create_key(**key_settings))


async def ledger_rows(gateway: Gateway) -> list[Any]:
    assert await gateway.server.app[app_keys.LEDGER].flush()
    return await gateway.db.fetch("SELECT * FROM usage_events ORDER BY id")


async def test_create_answers_text_with_usage_and_get_returns_it(upstream: Upstream) -> None:
    client = await client_for(upstream)
    response = await client.responses.create(
        model="m-1", input="Say hello", instructions="Be brief.", max_output_tokens=64
    )
    assert response.output_text == upstream.reply
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert response.usage is not None and response.usage.output_tokens > 0
    assert response.usage.input_tokens > 0

    sent = upstream.sent()[-1]
    if upstream.kind == "native":
        # Venice has no 'instructions' or 'store': they arrive as a developer message, and left out.
        assert sent["input"][0] == {"type": "message", "role": "developer", "content": "Be brief."}
        assert "instructions" not in sent and "store" not in sent
    else:
        assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
        assert sent["max_completion_tokens"] == 64

    fetched = await client.responses.retrieve(response.id)
    assert fetched.id == response.id and fetched.output_text == upstream.reply
    rows = await ledger_rows(upstream.gateway)
    assert len(rows) == 1
    assert (rows[0]["operation"], rows[0]["status"]) == ("chat", 200)
    assert rows[0]["output_tokens"] == response.usage.output_tokens


async def test_function_calling_over_two_turns_with_previous_response_id(
    upstream: Upstream,
) -> None:
    client = await client_for(upstream)
    first = await client.responses.create(
        model="m-1", input="What is 4 + 6?", tools=TOOLS, instructions="Use the tools."
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert (call.name, call.arguments) == ("add", TOOL_ARGUMENTS)

    second = await client.responses.create(
        model="m-1",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "10"}],
        tools=TOOLS,
    )
    assert second.output_text == upstream.reply
    assert second.previous_response_id == first.id
    items = await client.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == [
        "message",
        "function_call",
        "function_call_output",
    ]

    sent = upstream.sent()[-1]
    if upstream.kind == "native":
        kinds = [item.get("type", "message") for item in sent["input"]]
        # The first turn's input and call, then this turn's result; not the old instructions.
        assert kinds == ["message", "function_call", "function_call_output"]
        assert sent["input"][0]["content"] == "What is 4 + 6?"
        assert sent["tools"][0]["function"]["name"] == "add"  # Venice's nested tool shape
    else:
        roles = [message["role"] for message in sent["messages"]]
        assert roles == ["user", "assistant", "tool"]
        assert sent["messages"][1]["tool_calls"][0]["id"] == call.call_id
        assert sent["messages"][2] == {
            "role": "tool",
            "tool_call_id": call.call_id,
            "content": "10",
        }


async def test_unknown_or_foreign_previous_response_id_is_refused(upstream: Upstream) -> None:
    owner = await client_for(upstream, name="owner")
    other = await client_for(upstream, name="other")
    made = await owner.responses.create(model="m-1", input="hi")
    before = len(upstream.sent())
    for client, previous in ((owner, "resp_unknown"), (other, made.id)):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="m-1", input="again", previous_response_id=previous)
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "previous_response_not_found"
        assert error["param"] == "previous_response_id"
        assert previous in error["message"]
    assert len(upstream.sent()) == before  # refused before any provider call
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await owner.responses.retrieve("resp_\x00")  # no id the gateway makes; not a 500
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(made.id)
    await owner.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        await owner.responses.retrieve(made.id)


async def test_store_false_keeps_nothing(upstream: Upstream) -> None:
    client = await client_for(upstream)
    response = await client.responses.create(model="m-1", input="hi", store=False)
    assert response.output_text == upstream.reply
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="m-1", input="again", previous_response_id=response.id)


async def test_expired_responses_are_not_found(upstream: Upstream) -> None:
    client = await client_for(upstream)
    response = await client.responses.create(model="m-1", input="hi")
    await client.responses.retrieve(response.id)
    await upstream.gateway.db.execute(
        "UPDATE responses SET created_at = now() - interval '2 days', "
        "expires_at = now() - interval '1 day'"
    )
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="m-1", input="again", previous_response_id=response.id)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "previous_response_not_found"


AGENTS = {
    "type": "namespace",
    "name": "agents",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
        }
    ],
}
MCP = {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example/sse"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_tools_chat_cannot_offer_are_left_out_and_said_so(
    gateway: Gateway, api_key: str, stream: bool
) -> None:
    """Against a chat-only provider (the fake Venice refuses any tool but a chat function): a
    namespace's functions are offered one by one and their calls come back named as the Responses
    API names them; hosted tools are left out, and the answer and the span say which."""
    client = gateway.client(api_key)
    tools: list[Any] = [AGENTS, {"type": "web_search"}, *TOOLS, MCP]
    raw = await client.responses.with_raw_response.create(
        model="qwen3-5-9b", input="Close a1.", tools=tools, stream=stream
    )
    assert raw.headers["llmgw-omitted-tools"] == "web_search, mcp"
    if stream:
        events = [event async for event in raw.parse()]
        final = events[-1].response
    else:
        final = raw.parse()
    call = final.output[0]
    assert call.type == "function_call"
    assert (call.name, call.namespace, call.arguments) == ("close_agent", "agents", TOOL_ARGUMENTS)
    sent = gateway.fake.received[-1].json
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["agents__close_agent", "add"]
    spans = gateway.telemetry.finished_spans
    await eventually(lambda: any(span.name == "POST /v1/responses" for span in spans()))
    server = gateway.telemetry.span("POST /v1/responses")
    assert server.attributes["llmgw.responses.omitted_tools"] == ("web_search", "mcp")

    second = await client.responses.create(
        model="qwen3-5-9b",
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "closed"}],
        tools=tools,
    )
    assert second.output_text == gateway.fake.reply
    history = gateway.fake.received[-1].json["messages"]
    assert history[1]["tool_calls"][0]["function"]["name"] == "agents__close_agent"
    assert history[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "closed"}


async def test_provider_errors_take_openai_shape_with_the_provider_message(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.enqueue(Behaviour(status=429, retry_after="7"))
    client = gateway.client(api_key)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.responses.create(model="qwen3-5-9b", input="hi")
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body == {
        "message": "Rate limit exceeded",
        "type": "upstream_error",
        "code": "provider_error",
    }
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model="venice-nonexistent-x", input="hi")
    assert isinstance(missing.value.body, dict)
    assert "Specified model not found" in missing.value.body["message"]


async def test_stream_text_has_the_full_event_sequence_and_is_stored(upstream: Upstream) -> None:
    client = await client_for(upstream)
    async with client.responses.stream(model="m-1", input="Say hello") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert {"response.output_item.added", "response.content_part.added"} <= set(kinds)
    assert {"response.output_text.done", "response.output_item.done"} <= set(kinds)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == upstream.reply
    assert final.usage is not None and final.usage.output_tokens > 0
    assert events[0].response.id == final.id
    stored = await client.responses.retrieve(final.id)
    assert stored.output_text == upstream.reply

    rows = await ledger_rows(upstream.gateway)
    assert [(r["operation"], r["stream"], r["status"]) for r in rows] == [("chat", True, 200)]
    # Usage from the provider's final figures (response.completed for a native provider).
    assert rows[0]["output_tokens"] == final.usage.output_tokens
    assert rows[0]["input_tokens"] == final.usage.input_tokens


async def test_streamed_function_calling_over_two_turns(upstream: Upstream) -> None:
    client = await client_for(upstream)
    async with client.responses.stream(model="m-1", input="4 + 6?", tools=TOOLS) as stream:
        events = [event async for event in stream]
        first = await stream.get_final_response()
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.name, call.arguments) == ("add", TOOL_ARGUMENTS)
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert arguments == TOOL_ARGUMENTS
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[-1].item.type == "function_call" and done[-1].item.arguments == TOOL_ARGUMENTS

    async with client.responses.stream(
        model="m-1",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "10"}],
        tools=TOOLS,
    ) as stream:
        second = await stream.get_final_response()
    assert second.output_text == upstream.reply


async def test_stream_frames_carry_event_lines(upstream: Upstream) -> None:
    key = await upstream.gateway.create_key()
    async with aiohttp.ClientSession() as session:
        async with session.post(
            upstream.gateway.url("/v1/responses"),
            json={"model": "m-1", "input": "hi", "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            assert response.content_type == "text/event-stream"
            raw = (await response.read()).decode()
    frames = [frame for frame in raw.split("\n\n") if frame]
    assert frames[0].startswith("event: response.created\ndata: {")
    for frame in frames:
        event_line, data_line = frame.split("\n")
        assert orjson.loads(data_line.removeprefix("data: "))["type"] == event_line.removeprefix(
            "event: "
        )
    assert "[DONE]" not in raw


async def test_a_stream_broken_by_the_provider_ends_with_error_and_response_failed(
    gateway: Gateway, api_key: str
) -> None:
    # Twice: the continuation on the only deployment breaks too.
    gateway.fake.enqueue(
        Behaviour(error_event_after_chunks=2), Behaviour(error_event_after_chunks=1)
    )
    client = gateway.client(api_key)
    stream = await client.responses.create(model="qwen3-5-9b", input="hi", stream=True)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-2:] == ["error", "response.failed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error"
    # The text that did arrive is closed properly before the failure.
    assert "response.output_item.done" in kinds
    rows = await ledger_rows(gateway)
    assert [(r["status"], r["error_type"]) for r in rows] == [(200, "upstream_stream_error")]


def test_the_responses_mode_of_a_provider_is_validated(tmp_path: Path) -> None:
    def spec(value: str) -> str:
        return (
            '[[providers]]\nname = "v"\nkind = "venice"\nbase_url = "http://127.0.0.1:1/api/v1"\n'
            f"responses = {value}\n"
        )

    path = tmp_path / "llmgw.toml"
    path.write_text(spec('"native"'))
    assert load_provider_config(path, {}).providers[0].capabilities.native_responses
    path.write_text(spec('"sometimes"'))
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(path, {})
    assert str(caught.value).endswith(
        'providers[0].responses: expected "translate" or "native", got "sometimes"'
    )


async def test_prune_deletes_only_expired_responses(upstream: Upstream, database_url: str) -> None:
    client = await client_for(upstream)
    kept = await client.responses.create(model="m-1", input="keep me")
    gone = await client.responses.create(model="m-1", input="prune me")
    await client.responses.retrieve(gone.id)  # both are written by now
    await upstream.gateway.db.execute(
        "UPDATE responses SET created_at = now() - interval '2 days', "
        "expires_at = now() - interval '1 day' WHERE id = $1",
        gone.id,
    )
    pruned = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmgw", "responses", "prune"],
        env=clean_env(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.strip() == "deleted 1 expired responses"
    assert await upstream.gateway.db.fetchval("SELECT array_agg(id) FROM responses") == [kept.id]


_DISK_FULL = """
CREATE FUNCTION pg_temp.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
END $$;
CREATE TRIGGER disk_full BEFORE INSERT ON responses
    FOR EACH ROW EXECUTE FUNCTION pg_temp.disk_full();
"""


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_response_the_store_could_not_keep_says_store_false(
    upstream: Upstream, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    client = await client_for(upstream)
    db = upstream.gateway.db
    await db.execute(_DISK_FULL)  # every INSERT into responses fails as on a full disk
    try:
        if stream:
            async with client.responses.stream(model="m-1", input="hi") as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(model="m-1", input="hi")
    finally:
        await db.execute("DROP TRIGGER disk_full ON responses")
    assert response.output_text == upstream.reply and response.status == "completed"
    assert response.store is False  # not kept, and the answer says so
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and response.id in r.message]
    assert len(warnings) == 1 and "could not be stored" in warnings[0].message
    kept = await client.responses.create(model="m-1", input="hi")  # the disk has room again
    assert kept.store is True
    assert (await client.responses.retrieve(kept.id)).id == kept.id


async def test_a_previous_response_chain_is_bounded_by_the_responses_body_limit(
    start_gateway: Any, fake_openai: FakeOpenAI
) -> None:
    limit = 100 * 1024
    gateway: Gateway = await start_gateway(
        providers=(chat_only(fake_openai),), responses_body_limit_bytes=limit
    )
    client = gateway.client(await gateway.create_key())
    turn = "x" * (30 * 1024)  # each request is well under the limit; the chain is not
    previous = None
    for _ in range(3):
        made = await client.responses.create(model="m-1", input=turn, previous_response_id=previous)
        previous = made.id
    sent = len(fake_openai.calls("/v1/chat/completions"))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="m-1", input=turn, previous_response_id=previous)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "previous_response_id"
    assert error["code"] == "context_length_exceeded"
    assert f"{limit} bytes" in error["message"] and "RESPONSES_BODY_LIMIT_BYTES" in error["message"]
    assert len(fake_openai.calls("/v1/chat/completions")) == sent  # refused before forwarding
    rows = await ledger_rows(gateway)
    assert len(rows) == 3  # and before admission: no ledger row for the refusal
    # A new conversation (or a shorter one) still goes through.
    assert (await client.responses.create(model="m-1", input=turn)).status == "completed"
