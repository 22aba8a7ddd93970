"""The error middleware's treatment of a caller that hung up mid-answer."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web

from llmgw.middleware import add_response_headers, error_middleware


async def _cut_off_mid_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"data: first\n\n")
    # What aiohttp raises (ClientConnectionResetError) when the caller's socket is gone.
    raise ConnectionResetError("Cannot write to closing transport")


async def _cut_off_before_an_answer(request: web.Request) -> web.StreamResponse:
    raise ConnectionResetError("Connection lost")


@pytest.mark.parametrize(
    ("handler", "status"), [(_cut_off_mid_stream, 200), (_cut_off_before_an_answer, 499)]
)
async def test_a_caller_that_hung_up_is_counted_not_logged_as_an_error(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture, handler: Any, status: int
) -> None:
    resets: list[None] = []
    app = web.Application(
        middlewares=[error_middleware(on_caller_left=lambda: resets.append(None))]
    )
    app.on_response_prepare.append(add_response_headers)
    app.router.add_get("/", handler)
    client = await aiohttp_client(app)
    caplog.set_level(logging.DEBUG)

    for _ in range(3):
        async with client.get("/") as response:
            assert response.status == status
            await response.read()
    assert len(resets) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
