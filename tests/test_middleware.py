"""The error middleware's treatment of a caller that hung up mid-answer."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.middleware import add_response_headers, error_middleware


def _hang_up(request: web.Request) -> None:
    """What the caller does by leaving: its connection is closing when the gateway writes."""
    assert request.transport is not None
    request.transport.close()
    # What aiohttp raises (ClientConnectionResetError) when the caller's socket is gone.
    raise ConnectionResetError("Cannot write to closing transport")


async def _cut_off_mid_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"data: first\n\n")
    _hang_up(request)
    return response


async def _cut_off_before_an_answer(request: web.Request) -> web.StreamResponse:
    _hang_up(request)
    return web.Response()


async def _another_connection_reset(request: web.Request) -> web.StreamResponse:
    raise ConnectionResetError("a database's connection, say; the caller is still there")


def app_with(handler: Any, resets: list[None]) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware(on_caller_left=lambda: resets.append(None))]
    )
    app.on_response_prepare.append(add_response_headers)
    app.router.add_get("/", handler)
    return app


@pytest.mark.parametrize("handler", [_cut_off_mid_stream, _cut_off_before_an_answer])
async def test_a_caller_that_hung_up_is_counted_not_logged_as_an_error(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture, handler: Any
) -> None:
    resets: list[None] = []
    client = await aiohttp_client(app_with(handler, resets))
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        with contextlib.suppress(aiohttp.ClientError):
            async with client.get("/") as response:
                await response.read()
    assert len(resets) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_reset_of_another_connection_is_the_gateways_own_failure(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    resets: list[None] = []
    client = await aiohttp_client(app_with(_another_connection_reset, resets))
    async with client.get("/") as response:
        assert response.status == 500
        assert (await response.json())["error"]["code"] == "internal_error"
    assert resets == []
    assert "unexpected error while handling GET /" in caplog.text
