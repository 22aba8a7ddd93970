"""The relay on a real socket: byte-for-byte forwarding, and the StreamTranslator hook."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry import metrics, trace

from llmgw.errors import GatewayError
from llmgw.streaming.relay import StreamSummary, relay_stream
from llmgw.telemetry.genai import ChatObservation, GatewayInstruments


class ScriptedStream:
    """A provider stream that yields the given reads, then ends (or raises ``error``)."""

    def __init__(self, reads: Sequence[bytes], error: Exception | None = None) -> None:
        self.reads = list(reads)
        self.error = error
        self.retries = 0
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        for data in self.reads:
            yield data
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        self.closed = True


class FakeTranslator:
    """Names what it was given, so the test can see each hook was called in order."""

    def start(self) -> bytes:
        return b"event: start\n\n"

    def feed(self, chunk: dict[str, Any]) -> bytes:
        return b"event: chunk\ndata: " + orjson.dumps(chunk.get("choices")) + b"\n\n"

    def finish(self) -> bytes:
        return b"event: finish\n\n"

    def error(self, error: GatewayError) -> bytes:
        return b"event: error\ndata: " + error.error_kind.encode() + b"\n\n"


def observation() -> ChatObservation:
    return ChatObservation.start(
        trace.NoOpTracer(),
        GatewayInstruments(metrics.NoOpMeter("test")),
        operation="chat",
        provider_name="fake",
        server_address="127.0.0.1",
        server_port=1,
        provider_reports_cost=True,
        body={},
        model="m",
        stream=True,
        capture_content=False,
    )


def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "choices": choices, **extra}) + b"\n\n"


FIRST = chunk([{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}])
FINISH = chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE = chunk([], usage={"prompt_tokens": 3, "completion_tokens": 1})
DONE = b"data: [DONE]\n\n"

Relay = Callable[..., Awaitable[tuple[bytes, list[tuple[StreamSummary, ChatObservation]]]]]


async def relay(
    stream: ScriptedStream, translator: FakeTranslator | None = None
) -> tuple[bytes, list[tuple[StreamSummary, ChatObservation]]]:
    """The body the client got, and how each relayed stream ended (with what it observed)."""
    records: list[tuple[StreamSummary, ChatObservation]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        observed = observation()
        summary = await relay_stream(
            request, stream, observed, hide_usage_chunk=False, translator=translator
        )
        records.append((summary, observed))
        return summary.response

    app = web.Application()
    app.router.add_get("/", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as answer:
            body = await answer.read()
    finally:
        await server.close()
    return body, records


async def test_without_a_translator_events_are_forwarded_byte_for_byte() -> None:
    reads = [FIRST[:7], FIRST[7:] + FINISH, USAGE + DONE]
    body, records = await relay(ScriptedStream(reads))
    assert body == FIRST + FINISH + USAGE + DONE
    assert [summary.outcome for summary, _ in records] == ["completed"]


async def test_a_translator_gets_start_every_chunk_and_finish_instead_of_done() -> None:
    stream = ScriptedStream([FIRST, FINISH[:5], FINISH[5:], USAGE, DONE])
    body, records = await relay(stream, FakeTranslator())
    assert body == (
        b"event: start\n\n"
        b'event: chunk\ndata: [{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]\n\n'
        b'event: chunk\ndata: [{"index":0,"delta":{},"finish_reason":"stop"}]\n\n'
        b"event: chunk\ndata: []\n\n"
        b"event: finish\n\n"
    )
    assert stream.closed
    ((summary, observed),) = records
    assert observed.usage is not None
    usage = (observed.usage.input_tokens, observed.usage.output_tokens)
    assert (summary.outcome, *usage) == ("completed", 3, 1)


async def test_a_translator_renders_a_failure_after_start_as_its_own_error_event() -> None:
    body, records = await relay(ScriptedStream([FIRST]), FakeTranslator())
    assert body.startswith(b"event: start\n\nevent: chunk\n")
    assert body.endswith(b"event: error\ndata: upstream_stream_incomplete\n\n")
    assert b"[DONE]" not in body and b"event: finish" not in body
    assert [summary.outcome for summary, _ in records] == ["failed"]
