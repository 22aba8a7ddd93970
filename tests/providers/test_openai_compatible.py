"""The OpenAI-compatible adapter against an upstream that misbehaves on purpose (real sockets)."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.errors import UpstreamAuthFailed, UpstreamTimeout, UpstreamUnavailable
from llmgw.providers.base import UpstreamCall, UpstreamHTTPError
from llmgw.providers.openai_compatible import OpenAICompatibleProvider, new_client_session
from llmgw.providers.plugin import Timeouts
from llmgw.routing.retry import RetryPolicy

LIMIT = 1024 * 1024
BOMB_SIZE = 200 * 1024 * 1024  # decompressed; about 200 KB on the wire
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def gzip_bomb(size: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip container
    block = bytes(1024 * 1024)
    parts = [compressor.compress(block) for _ in range(size // len(block))]
    return b"".join(parts) + compressor.flush()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb(BOMB_SIZE)


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[TestServer] = []

    async def serve(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/v1/{tail:.*}", handler)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("/v1"))

    yield serve
    for server in servers:
        await server.close()


def provider(
    base_url: str, api_key: str | None = "provider-secret-key", *, stall: float = 5.0
) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(
        name="upstream-a",
        base_url=base_url,
        api_key=api_key,
        session=new_client_session(),
        retry=RetryPolicy(max_retries=0),
        timeouts=Timeouts(attempt=5.0, connect=5.0, first_token=5.0, stall=stall),
        max_response_bytes=LIMIT,
    )


def call() -> UpstreamCall:
    deadline = asyncio.get_running_loop().time() + 10
    return UpstreamCall(body=b'{"model":"m","messages":[]}', deadline=deadline, model="m")


async def big_json(request: web.Request) -> web.StreamResponse:
    return web.Response(
        body=b'{"x":"' + b"a" * (5 * LIMIT) + b'"}', content_type="application/json"
    )


async def big_chunked(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for _ in range(5 * 16):
        await response.write(b"a" * 65536)
    await response.write_eof()
    return response


@pytest.mark.parametrize("handler", [big_json, big_chunked], ids=["content-length", "chunked"])
async def test_an_answer_over_the_limit_is_a_502(upstream, handler: Handler) -> None:
    adapter = provider(await upstream(handler))
    try:
        for operation in (adapter.chat_completion, adapter.embeddings):
            with pytest.raises(UpstreamUnavailable) as caught:
                await operation(call())
            assert caught.value.code == "upstream_response_too_large"
            assert caught.value.status == 502
            assert "upstream-a" in caught.value.message
        with pytest.raises(UpstreamUnavailable) as caught:
            await adapter.list_models(asyncio.get_running_loop().time() + 5)
        assert caught.value.code == "upstream_response_too_large"
    finally:
        await adapter.close()


async def test_a_gzip_bomb_is_given_up_without_inflating_it(upstream, bomb: bytes) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )

    adapter = provider(await upstream(handler))
    tracemalloc.start()
    try:
        with pytest.raises(UpstreamUnavailable) as caught:
            await adapter.chat_completion(call())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await adapter.close()
    assert caught.value.code == "upstream_response_too_large"
    assert len(bomb) < 1024 * 1024
    assert peak < 16 * LIMIT, f"reading a {len(bomb)}-byte bomb peaked at {peak} bytes"
    print(f"gzip bomb of {len(bomb)} bytes ({BOMB_SIZE} inflated): peak {peak / 2**20:.1f} MiB")


async def test_an_answer_at_the_limit_is_read_whole(upstream) -> None:
    body = b'{"x":"' + b"a" * (LIMIT - 8) + b'"}'

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    adapter = provider(await upstream(handler))
    try:
        assert (await adapter.chat_completion(call())).body == body
    finally:
        await adapter.close()


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("api_key", ["provider-secret-key", None], ids=["with-key", "keyless"])
async def test_a_refused_provider_key_is_a_502_naming_the_provider(
    upstream, caplog: pytest.LogCaptureFixture, status: int, api_key: str | None
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": "Authentication failed"}, status=status)

    adapter = provider(await upstream(handler), api_key)
    caplog.set_level(logging.WARNING, logger="llmgw.providers.openai_compatible")
    try:
        for attempt in (
            adapter.chat_completion(call()),
            adapter.stream_chat_completion(call()),
            adapter.list_models(asyncio.get_running_loop().time() + 5),
        ):
            with pytest.raises(UpstreamAuthFailed) as caught:
                await attempt
            error = caught.value
            assert (error.status, error.code) == (502, "upstream_auth_failed")
            assert "upstream-a" in error.message and "Authentication failed" not in error.message
    finally:
        await adapter.close()
    logged = [r.getMessage() for r in caplog.records]
    assert logged and all("provider upstream-a" in line for line in logged)
    assert not any("provider-secret-key" in line for line in logged)


async def test_other_errors_still_pass_through(upstream) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": "bad request"}, status=400)

    adapter = provider(await upstream(handler))
    try:
        with pytest.raises(UpstreamHTTPError) as caught:
            await adapter.chat_completion(call())
        assert caught.value.response.status == 400
    finally:
        await adapter.close()


def paced_events(count: int, pause: float, *, stall_after: int | None = None) -> Handler:
    """An event stream of ``count`` events ``pause`` apart; silent after ``stall_after`` of them."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(count):
            if index == stall_after:
                await asyncio.sleep(30)
            await response.write(b"data: {}\n\n")
            await asyncio.sleep(pause)
        await response.write(b"data: [DONE]\n\n")
        return response

    return handler


async def test_a_read_waiting_past_the_stall_timeout_ends_the_stream(upstream) -> None:
    adapter = provider(await upstream(paced_events(5, 0.01, stall_after=2)), stall=0.3)
    loop = asyncio.get_running_loop()
    try:
        stream = await adapter.stream_chat_completion(call())
        received = b""
        with pytest.raises(UpstreamTimeout) as caught:
            async for data in stream.chunks():
                received += data
                stalled_from = loop.time()
        assert 0.3 <= loop.time() - stalled_from < 0.3 + 0.5
        assert caught.value.code == "upstream_stream_timeout"
        assert received == b"data: {}\n\n" * 2
    finally:
        await adapter.close()


async def test_a_caller_slower_than_the_stall_timeout_is_not_a_stall(upstream) -> None:
    # The provider writes every 10 ms; the caller takes 0.25 s over each event, past the 0.2 s
    # stall timeout in all: only a read's own wait counts.
    adapter = provider(await upstream(paced_events(4, 0.01)), stall=0.2)
    try:
        stream = await adapter.stream_chat_completion(call())
        received = b""
        async for data in stream.chunks():
            received += data
            await asyncio.sleep(0.25)
        assert received.endswith(b"data: [DONE]\n\n")
    finally:
        await adapter.close()
