"""Claude Code's traffic through /v1/messages: its recorded request shapes replayed, and ``claude
-p`` itself (``@anthropic-ai/claude-code`` from npm, see tests/agent_clis.py) completing a prompt
and a tool use against the gateway and the fake Venice, against an upstream that refuses
``reasoning_effort``, and with a body past the chat routes' 1 MiB."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from llmgw.telemetry import semconv as sc
from tests.agent_clis import CLAUDE_CODE, agent_cli, run_agent_cli
from tests.conftest import Gateway
from tests.fake_openai import providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.test_messages import read_events
from tests.test_providers_routing import provider

# Claude Code itself (node) against a gateway: pytest -m slow.
pytestmark = pytest.mark.slow

RECORDED = json.loads((Path(__file__).parent / "data" / "claude_code_request.json").read_text())
MODEL = "qwen3-5-9b"


def claude_code_request(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {**RECORDED["body"], "model": MODEL, **changes}
    return body


async def post(
    gateway: Gateway, key: str, body: dict[str, Any], path: str = RECORDED["path"]
) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url(path), json=body, headers={**RECORDED["headers"], "x-api-key": key}
        )
        await response.read()
        return response


async def test_recorded_claude_code_request_streams_and_reaches_venice_translated(
    gateway: Gateway, api_key: str
) -> None:
    response = await post(gateway, api_key, claude_code_request())
    assert response.status == 200, await response.text()
    names = [name for name, _ in await read_events(response)]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == [
        "message_delta",
        "message_stop",
    ]
    # Claude Code offers tools, so the fake calls the first one: a tool_use block.
    assert "content_block_start" in names

    sent = gateway.fake.received[-1].json
    recorded = RECORDED["body"]
    system = sent["messages"][0]
    assert system["role"] == "system"
    assert [part.get("cache_control") for part in system["content"]] == [
        block.get("cache_control") for block in recorded["system"]
    ]
    assert [m["role"] for m in sent["messages"][1:]] == ["user", "system"]
    assert sent["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert [tool["function"]["name"] for tool in sent["tools"]] == [
        tool["name"] for tool in recorded["tools"]
    ]
    assert all(tool["function"]["parameters"] for tool in sent["tools"])
    assert sent["reasoning_effort"] == recorded["output_config"]["effort"]
    assert sent["user"] == recorded["metadata"]["user_id"]
    assert sent["max_completion_tokens"] == recorded["max_tokens"]
    assert sent["stream_options"] == {"include_usage": True}
    for dropped in ("context_management", "thinking", "output_config", "metadata", "system"):
        assert dropped not in sent
    assert "anthropic-beta" not in gateway.fake.received[-1].headers


async def test_recorded_claude_code_request_counts_and_answers_unstreamed(
    gateway: Gateway, api_key: str
) -> None:
    counted = await post(
        gateway, api_key, claude_code_request(), path="/v1/messages/count_tokens?beta=true"
    )
    assert counted.status == 200
    tokens = (await counted.json())["input_tokens"]
    # Tens of kilobytes of recorded prompt and tool schemas: thousands of tokens, never 0.
    assert tokens > 2000
    plain = await post(gateway, api_key, claude_code_request(stream=False))
    assert plain.status == 200
    message = await plain.json()
    assert message["stop_reason"] == "tool_use"
    assert message["content"][0]["name"] == RECORDED["body"]["tools"][0]["name"]


@pytest.fixture(scope="session")
def claude() -> Path:
    """Claude Code's binary, installed from npm if needed (skipped only when npm cannot)."""
    return agent_cli(CLAUDE_CODE)


async def run_claude(
    claude: Path,
    gateway: Gateway,
    key: str,
    prompt: str,
    workdir: Path,
    *,
    stdin: bytes | None = None,
) -> str:
    """``claude -p prompt`` against the gateway, offline: its own HOME, no telemetry or updates.

    ``stdin``: piped to it, which Claude Code adds to the prompt.
    """
    (workdir / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        HOME=str(workdir / "home"),
        ANTHROPIC_BASE_URL=gateway.url("/").rstrip("/"),
        ANTHROPIC_API_KEY=key,
        ANTHROPIC_MODEL=MODEL,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return await run_agent_cli(claude, "-p", prompt, env=env, cwd=workdir, stdin=stdin)


async def test_claude_code_completes_a_prompt(
    claude: Path, gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    output = await run_claude(claude, gateway, api_key, "say hi", tmp_path)
    assert output.strip() == "Hello from fake Venice!"
    assert any(r.path == "/api/v1/chat/completions" for r in gateway.fake.received)


async def test_claude_code_runs_a_tool_and_sends_its_result(
    claude: Path, gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker.txt"
    marker.write_text("marker-7c1e9a\n")
    gateway.fake.tool_call = ("Read", orjson.dumps({"file_path": str(marker)}).decode())
    output = await run_claude(claude, gateway, api_key, "read marker.txt", tmp_path)
    assert output.strip() == "Hello from fake Venice!"
    results = [
        message
        for request in gateway.fake.received
        if request.json and "messages" in request.json
        for message in request.json["messages"]
        if message.get("role") == "tool"
    ]
    assert any("marker-7c1e9a" in str(message["content"]) for message in results), results


async def test_claude_code_works_against_an_upstream_that_refuses_reasoning_effort(
    claude: Path, start_gateway: Any, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    # LiteLLM (an openai-compatible upstream) answered every Claude Code request with a 400.
    fake_venice.refused_params = frozenset({"reasoning_effort", "reasoning"})
    toml = provider("litellm", "openai-compatible", fake_venice.base_url, "VENICE_API_KEY")
    settings = providers_settings(tmp_path, toml, VENICE_API_KEY=FAKE_VENICE_KEY)
    gateway: Gateway = await start_gateway(**settings)

    output = await run_claude(claude, gateway, await gateway.create_key(), "say hi", tmp_path)
    assert output.strip() == "Hello from fake Venice!"
    sent = [r.json for r in fake_venice.received if r.path == "/api/v1/chat/completions"]
    assert sent and not any("reasoning_effort" in body for body in sent)
    omitted = [
        span.attributes.get(sc.LLMGW_OMITTED_PARAMS)
        for span in gateway.telemetry.finished_spans()
        if span.name.startswith("chat ")
    ]
    assert ("reasoning_effort",) in omitted, "Claude Code asked for thinking; it was left out"


async def test_claude_code_sends_a_3_mb_request_under_the_default_limits(
    claude: Path, gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    pasted = b"the quick brown fox jumps over the lazy dog\n" * (3 * 2**20 // 44 + 1)
    output = await run_claude(
        claude, gateway, api_key, "summarise the text on stdin", tmp_path, stdin=pasted
    )
    assert output.strip() == "Hello from fake Venice!"
    largest = max(
        len(orjson.dumps(r.json))
        for r in gateway.fake.received
        if r.path == "/api/v1/chat/completions"
    )
    assert largest > 3 * 2**20, "the pasted text reached the upstream whole"
