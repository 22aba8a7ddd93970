"""Claude Code's traffic through /v1/messages: its recorded request shapes replayed, and (when the
``claude`` binary of ``@anthropic-ai/claude-code`` is installed: ``CLAUDE_CODE_BIN`` or on PATH)
``claude -p`` itself completing a prompt and a tool use against the gateway and the fake Venice."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import Gateway
from tests.test_messages import read_events

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


CLAUDE = os.environ.get("CLAUDE_CODE_BIN") or shutil.which("claude")
needs_claude = pytest.mark.skipif(
    CLAUDE is None,
    reason="Claude Code not installed (npm i @anthropic-ai/claude-code; CLAUDE_CODE_BIN)",
)


async def run_claude(gateway: Gateway, key: str, prompt: str, workdir: Path) -> str:
    """``claude -p prompt`` against the gateway, offline: its own HOME, no telemetry or updates."""
    assert CLAUDE is not None
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
    process = await asyncio.create_subprocess_exec(
        CLAUDE,
        "-p",
        prompt,
        cwd=workdir,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, (stdout.decode(), stderr.decode())
    return stdout.decode()


@needs_claude
async def test_claude_code_completes_a_prompt(
    gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    output = await run_claude(gateway, api_key, "say hi", tmp_path)
    assert output.strip() == "Hello from fake Venice!"
    assert any(r.path == "/api/v1/chat/completions" for r in gateway.fake.received)


@needs_claude
async def test_claude_code_runs_a_tool_and_sends_its_result(
    gateway: Gateway, api_key: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker.txt"
    marker.write_text("marker-7c1e9a\n")
    gateway.fake.tool_call = ("Read", orjson.dumps({"file_path": str(marker)}).decode())
    output = await run_claude(gateway, api_key, "read marker.txt", tmp_path)
    assert output.strip() == "Hello from fake Venice!"
    results = [
        message
        for request in gateway.fake.received
        if request.json and "messages" in request.json
        for message in request.json["messages"]
        if message.get("role") == "tool"
    ]
    assert any("marker-7c1e9a" in str(message["content"]) for message in results), results
