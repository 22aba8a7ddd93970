"""Helpers of the streaming tests: a scripted provider stream, a relay on a real socket, and a
reference SSE parser written straight from the spec (whole text at once, nothing incremental)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry import trace

from llmgw.accounting.usage import CostReport
from llmgw.streaming import supervisor
from llmgw.streaming.continuation import Continuation
from llmgw.streaming.relay import relay_stream
from llmgw.streaming.summary import StreamSummary
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry.genai import ChatObservation, GatewayInstruments
from llmgw.telemetry.local_metrics import LocalMeter

DONE = b"data: [DONE]\n\n"


class ScriptedStream:
    """A provider stream that yields the given reads (a float: a pause of that many seconds), then
    ends (or raises ``error``)."""

    def __init__(
        self,
        reads: Sequence[bytes | float],
        error: Exception | None = None,
        content_type: str = "text/event-stream",
        *,
        stall: bool = False,
    ) -> None:
        self.reads: list[bytes | float] = list(reads)
        self.error = error
        self.stall = stall  # after the reads, wait for more that never comes
        self.retries = 0
        self.content_type = content_type
        self.closed = False

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        # Reads are taken off the list: a second chunks() goes on where the first stopped.
        while self.reads:
            data = self.reads.pop(0)
            if isinstance(data, float):
                await asyncio.sleep(data)
                continue
            yield data
        if self.stall:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        self.closed = True


def observation() -> ChatObservation:
    return ChatObservation.start(
        trace.NoOpTracer(),
        GatewayInstruments(LocalMeter()),
        operation="chat",
        provider_name="fake",
        server_address="127.0.0.1",
        server_port=1,
        provider_cost_report=CostReport("venice.cost"),
        body={},
        model="m",
        stream=True,
        capture_content=False,
    )


def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "choices": choices, **extra}) + b"\n\n"


async def relay(
    stream: ScriptedStream,
    *,
    translator: StreamTranslator | None = None,
    hide_usage_chunk: bool = False,
    max_event_bytes: int = 1 << 20,
    max_seconds: float = 30,
    hang_up_after: bytes | None = None,
    continuation: Continuation | None = None,
) -> tuple[bytes, list[StreamSummary]]:
    """What a client reads from a relay of ``stream``, and the summaries the relay delivered.

    With ``hang_up_after`` the client closes the connection once it has read that; the summaries
    are those delivered by the time the server shut down (drains included).
    """
    summaries: list[StreamSummary] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        return await relay_stream(
            request,
            stream,
            observation(),
            hide_usage_chunk=hide_usage_chunk,
            on_end=summaries.append,
            translator=translator,
            continuation=continuation,
        )

    app = web.Application()
    streams = supervisor.StreamSupervisor(
        max_seconds=max_seconds, max_event_bytes=max_event_bytes, shutdown_grace_seconds=5
    )
    supervisor.install(app, streams)
    app.router.add_get("/", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as answer:
            if hang_up_after is None:
                body = await answer.read()
            else:
                body = b""
                while hang_up_after not in body:
                    body += await answer.content.readany()
                answer.close()
                await asyncio.sleep(0.1)  # the server notices
    finally:
        await server.close()
    return body, summaries


_LINE = re.compile(rb"\r\n|\r|\n")


def parse_sse(text: bytes) -> list[bytes]:
    """The data of every event dispatched, as the SSE spec's parsing algorithm gives it."""
    events: list[bytes] = []
    data: list[bytes] | None = None
    lines = _LINE.split(text)
    for line in lines[:-1]:  # the last piece has no line ending: not a complete line
        if not line:
            if data is not None:
                events.append(b"\n".join(data))
            data = None
            continue
        name, colon, value = line.partition(b":")
        if name == b"data":
            data = [] if data is None else data
            data.append(value[1:] if colon and value.startswith(b" ") else value)
    return events


def payloads(body: bytes) -> list[Any]:
    """Every event's data, decoded: JSON values, and the string "[DONE]"."""
    return [
        "[DONE]" if data.strip() == b"[DONE]" else orjson.loads(data) for data in parse_sse(body)
    ]
