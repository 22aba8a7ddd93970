"""``llmgw smoke``: one plain and one streamed completion through a running gateway, with timings."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import aiohttp
import attrs
import orjson

from llmgw.config import load_bind_addr
from llmgw.providers.sse import SSEScanner, event_data

__all__ = ["default_base_url", "register"]


@attrs.frozen
class SmokeResult:
    kind: str
    status: int
    latency_ms: float
    first_chunk_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    error: str | None = None

    def line(self) -> str:
        ttfc = "-" if self.first_chunk_ms is None else f"{self.first_chunk_ms:.1f} ms"
        outcome = "ok" if self.error is None else f"FAILED: {self.error}"
        return (
            f"{self.kind:<9} status={self.status} latency={self.latency_ms:.1f} ms "
            f"first_chunk={ttfc} tokens={self.input_tokens}/{self.output_tokens} {outcome}"
        )


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    smoke = commands.add_parser(
        "smoke",
        help="send a plain and a streamed completion through a running gateway",
        description=(
            "Check a running gateway end to end: one non-streamed and one streamed chat completion. "
            "Prints status, latency, time to first chunk and tokens; exits 1 if either fails."
        ),
        epilog=(
            "environment variables:\n"
            "  LLMGW_KEY  default for --key\n"
            "  BIND_ADDR  where the gateway listens, for the default --base-url"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    smoke.add_argument(
        "--base-url",
        help="gateway API root (default: http://HOST:PORT/v1 from BIND_ADDR, 127.0.0.1:3000)",
    )
    smoke.add_argument(
        "--key", default=os.environ.get("LLMGW_KEY"), help="an llmgw key (default: $LLMGW_KEY)"
    )
    smoke.add_argument("--model", default="llama-3.2-3b", help="model to ask (default %(default)s)")
    smoke.set_defaults(run=_smoke)


def _usage(document: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = document.get("usage") if isinstance(document.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    return usage.get("prompt_tokens"), usage.get("completion_tokens")


async def _plain(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> SmokeResult:
    started = time.perf_counter()
    async with session.post(url, json=body) as response:
        payload = await response.read()
    latency = (time.perf_counter() - started) * 1000
    try:
        document = orjson.loads(payload)
    except orjson.JSONDecodeError:
        document = {}
    tokens = _usage(document) if isinstance(document, dict) else (None, None)
    error = None if response.status == 200 else payload.decode(errors="replace")[:200]
    return SmokeResult("plain", response.status, latency, None, *tokens, error=error)


async def _streamed(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> SmokeResult:
    started = time.perf_counter()
    first: float | None = None
    tokens: tuple[int | None, int | None] = (None, None)
    error: str | None = None
    streamed_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url, json=streamed_body) as response:
        if response.status != 200:
            error = (await response.text())[:200]
        else:
            scanner = SSEScanner()
            async for data in response.content.iter_any():
                for event in scanner.feed(data):
                    first = first if first is not None else (time.perf_counter() - started) * 1000
                    payload = event_data(event)
                    if payload is None or payload == b"[DONE]":  # a comment, or the end
                        continue
                    document = orjson.loads(payload)
                    if "error" in document:
                        error = str(document["error"])[:200]
                    elif document.get("usage"):
                        tokens = _usage(document)
    latency = (time.perf_counter() - started) * 1000
    return SmokeResult("streamed", response.status, latency, first, *tokens, error=error)


async def _run(base_url: str, key: str | None, model: str) -> list[SmokeResult]:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello in five words."}]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = base_url.rstrip("/") + "/chat/completions"
    async with aiohttp.ClientSession(
        headers=headers, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        return [await _plain(session, url, body), await _streamed(session, url, body)]


def default_base_url(bind: tuple[str, int]) -> str:
    """The API root of a gateway listening on ``bind``; a wildcard address is asked on loopback."""
    host, port = bind
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def _smoke(args: argparse.Namespace) -> int:
    base_url = args.base_url or default_base_url(load_bind_addr())
    try:
        results = asyncio.run(_run(base_url, args.key, args.model))
    except aiohttp.ClientError as exc:
        print(f"smoke: cannot reach {base_url}: {type(exc).__name__}")
        return 1
    for result in results:
        print(result.line())
    return 0 if all(result.error is None for result in results) else 1
