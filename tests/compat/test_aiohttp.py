"""aiohttp's connection hooks: on the verified versions a connection that is not valid HTTP gets the
JSON answer and connections are counted as they come; elsewhere aiohttp's own runner serves."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import metadata

import pytest
from aiohttp import web

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.compat.aiohttp import CONNECTION_HOOKS, app_runner
from llmgw.lifecycle.invalid_http import invalid_http_answer
from llmgw.lifecycle.open_files import OpenFiles
from llmgw.lifecycle.runner import listen
from llmgw.telemetry.refusals import RefusalLog
from tests.processes import Clock, eventually

NOT_HTTP = b"GET /\x00secret HTTP/1.1\r\nHost: x\r\n\r\n"
HTTP = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
OPEN_ELSEWHERE = 10  # the descriptors the guard reads (its readings are the test's)


class Served:
    def __init__(self, runner: web.AppRunner, port: int, open_files: OpenFiles) -> None:
        self.runner, self.port, self.open_files = runner, port, open_files

    async def exchange(self, request: bytes) -> bytes:
        """``request`` on a connection of its own; the whole answer (the server closes)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(request)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()


Serve = Callable[[], Awaitable[Served]]


async def ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve an app answering ``ok`` with :func:`app_runner`, as ``serve`` does, on a real socket."""
    runners: list[web.AppRunner] = []

    async def start() -> Served:
        app = web.Application()
        app.router.add_get("/", ok)
        open_files = OpenFiles(1000, count_open=lambda: OPEN_ELSEWHERE, clock=Clock())
        runner = app_runner(
            app,
            invalid_http=functools.partial(invalid_http_answer, refusals=RefusalLog()),
            connections=open_files,
            access_log=None,
        )
        runners.append(runner)
        await runner.setup()
        sock = listen("127.0.0.1", 0)
        await web.SockSite(runner, sock).start()
        return Served(runner, sock.getsockname()[1], open_files)

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PUBLIC_APIS_ONLY_VARIABLE, raising=False)
    if not CONNECTION_HOOKS.enabled():
        pytest.skip(f"verified on other aiohttp versions: {CONNECTION_HOOKS.state()}")


async def test_not_http_gets_the_json_answer_and_connections_are_counted(
    fast_path: None, serve: Serve
) -> None:
    served = await serve()
    answer = await served.exchange(NOT_HTTP)
    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 "))
    assert b"application/json" in answer and b'"invalid_http"' in answer
    assert b"secret" not in answer

    assert served.open_files.estimate() == OPEN_ELSEWHERE  # read now: nothing since
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(HTTP)
    await reader.readuntil(b"ok")  # answered: the server has made the connection
    assert served.open_files.estimate() == OPEN_ELSEWHERE + 1
    writer.close()
    await eventually(lambda: served.open_files.estimate() == OPEN_ELSEWHERE)


@pytest.mark.parametrize("off", ["public APIs only", "an unverified aiohttp"])
async def test_elsewhere_aiohttps_own_runner_serves(
    monkeypatch: pytest.MonkeyPatch, serve: Serve, off: str
) -> None:
    if off == "public APIs only":
        monkeypatch.setenv(PUBLIC_APIS_ONLY_VARIABLE, "true")
    else:
        monkeypatch.delenv(PUBLIC_APIS_ONLY_VARIABLE, raising=False)
        monkeypatch.setattr(metadata, "version", lambda distribution: "3.15.0")
    served = await serve()
    assert type(served.runner) is web.AppRunner

    answer = await served.exchange(NOT_HTTP)
    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 "))
    assert b"text/plain" in answer and b"invalid_http" not in answer  # aiohttp's answer

    assert served.open_files.estimate() == OPEN_ELSEWHERE
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    writer.write(HTTP)
    await reader.readuntil(b"ok")
    assert served.open_files.estimate() == OPEN_ELSEWHERE  # seen at the next reading only
    writer.close()
