"""Recorded chat events replayed on a real socket: a stored answer's in one chunk, events that
arrive as they come, each event unchanged either way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.errors import GatewayError, UpstreamUnavailable
from llmgw.streaming.replay import DONE_EVENT, replay_stream
from tests.streaming.relaying import chunk

FIRST = chunk([{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}])
FINISH = chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE = chunk([], usage={"prompt_tokens": 3, "completion_tokens": 1})

Serve = Callable[[web.Application], Awaitable[TestServer]]


async def _http_chunks(
    aiohttp_server: Serve, events: Sequence[bytes] | AsyncIterator[bytes], **options: Any
) -> list[bytes]:
    """The HTTP chunks (chunked transfer encoding) a replay of ``events`` sends."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response, _ = await replay_stream(request, events, translator=None, **options)
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    server = await aiohttp_server(app)
    chunks, part = [], b""
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        async for data, end_of_chunk in response.content.iter_chunks():
            part += data
            if end_of_chunk:
                chunks.append(part)
                part = b""
    return [c for c in [*chunks, part] if c]


async def test_a_stored_answer_goes_out_in_one_chunk_each_event_as_recorded(
    aiohttp_server: Serve,
) -> None:
    chunks = await _http_chunks(aiohttp_server, (FIRST, FINISH, USAGE), hide_usage_chunk=False)
    assert chunks == [FIRST + FINISH + USAGE + DONE_EVENT]


async def test_a_stored_answer_hides_the_usage_chunk_the_caller_did_not_ask_for(
    aiohttp_server: Serve,
) -> None:
    chunks = await _http_chunks(aiohttp_server, (FIRST, FINISH, USAGE), hide_usage_chunk=True)
    assert chunks == [FIRST + FINISH + DONE_EVENT]


async def test_events_that_arrive_go_out_as_they_come(aiohttp_server: Serve) -> None:
    async def arriving() -> AsyncIterator[bytes]:
        for event in (FIRST, FINISH, USAGE):
            yield event

    chunks = await _http_chunks(aiohttp_server, arriving(), hide_usage_chunk=False)
    assert chunks == [FIRST, FINISH, USAGE, DONE_EVENT]


async def test_a_stored_answer_that_fails_to_translate_sends_what_it_made_then_the_error(
    aiohttp_server: Serve,
) -> None:
    class FailingOnTheFinish:
        def start(self) -> bytes:
            return b"event: start\n\n"

        def feed(self, chunk: dict[str, Any]) -> bytes:
            if chunk["choices"][0]["finish_reason"] is not None:
                raise UpstreamUnavailable("no", code="upstream_stream_incomplete")
            return b"event: chunk\n\n"

        async def finish(self) -> bytes:
            return b"event: finish\n\n"

        def error(self, error: GatewayError) -> bytes:
            return b"event: error\ndata: " + error.error_kind.encode() + b"\n\n"

    failed: list[GatewayError | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response, error = await replay_stream(
            request, (FIRST, FINISH), hide_usage_chunk=False, translator=FailingOnTheFinish()
        )
        failed.append(error)
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as response:
        body = await response.read()
    assert (
        body
        == b"event: start\n\nevent: chunk\n\nevent: error\ndata: upstream_stream_incomplete\n\n"
    )
    assert isinstance(failed[0], UpstreamUnavailable)
