"""The gateway's middleware on an application of the tests' own routes: a caller that hung up
mid-answer, the error shape of a route's API, what the span and the metric say of a refusal."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.config import Settings
from llmgw.errors import GatewayError, RateLimited
from llmgw.middleware import add_response_headers
from llmgw.telemetry import semconv as sc
from tests.conftest import InMemoryTelemetry, make_telemetry, middleware_alone


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


async def _refused(request: web.Request) -> web.StreamResponse:
    raise RateLimited("Slow down.", headers={"Retry-After": "7"})


def _in_its_own_shape(error: GatewayError) -> bytes:
    return b'{"type":"error","error":{"type":"%s"}}' % error.error_type.encode()


@pytest.fixture
def telemetry() -> InMemoryTelemetry:
    return make_telemetry(Settings())


def app_with(handler: Any, telemetry: InMemoryTelemetry, **overrides: Any) -> web.Application:
    app = web.Application(middlewares=[middleware_alone(telemetry.telemetry, **overrides)])
    app.on_response_prepare.append(add_response_headers)
    app.router.add_get("/", handler)
    app.router.add_get("/own/shape", handler)
    return app


def _resets(telemetry: InMemoryTelemetry) -> int:
    return sum(p.value for p in telemetry.metric_points(sc.METRIC_CLIENT_CONNECTION_RESETS))


@pytest.mark.parametrize("handler", [_cut_off_mid_stream, _cut_off_before_an_answer])
async def test_a_caller_that_hung_up_is_counted_not_logged_as_an_error(
    aiohttp_client: Any,
    caplog: pytest.LogCaptureFixture,
    handler: Any,
    telemetry: InMemoryTelemetry,
) -> None:
    client = await aiohttp_client(app_with(handler, telemetry))
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        with contextlib.suppress(aiohttp.ClientError):
            async with client.get("/") as response:
                await response.read()
    assert _resets(telemetry) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_reset_of_another_connection_is_the_gateways_own_failure(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture, telemetry: InMemoryTelemetry
) -> None:
    client = await aiohttp_client(app_with(_another_connection_reset, telemetry))
    async with client.get("/") as response:
        assert response.status == 500
        assert (await response.json())["error"]["code"] == "internal_error"
    assert _resets(telemetry) == 0
    assert "unexpected error while handling GET /" in caplog.text


async def test_an_error_has_the_shape_of_its_route_s_api_and_is_in_the_span_and_metric(
    aiohttp_client: Any, telemetry: InMemoryTelemetry
) -> None:
    client = await aiohttp_client(
        app_with(_refused, telemetry, renderers=[("/own", _in_its_own_shape)])
    )
    async with client.get("/own/shape", headers={"X-Request-Id": "req-1"}) as own:
        assert (own.status, own.headers["Retry-After"]) == (429, "7")
        assert own.headers["X-Request-Id"] == "req-1"
        assert await own.json() == {"type": "error", "error": {"type": "rate_limit_error"}}
    async with client.get("/") as openai_shaped:
        assert (await openai_shaped.json())["error"]["type"] == "rate_limit_error"
    span = telemetry.span("GET /own/shape")
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 429
    assert span.attributes[sc.LLMGW_REQUEST_ID] == "req-1"
    assert span.attributes[sc.ERROR_TYPE] == RateLimited("").error_kind
    points = telemetry.metric_points(sc.METRIC_GATEWAY_REQUESTS)
    assert sorted((p.attributes[sc.HTTP_ROUTE], p.value) for p in points) == [
        ("/", 1),
        ("/own/shape", 1),
    ]


async def test_a_route_outside_the_public_ones_needs_a_key(
    aiohttp_client: Any, telemetry: InMemoryTelemetry
) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(text="never")

    client = await aiohttp_client(app_with(answer, telemetry, public_prefixes=()))
    async with client.get("/", headers={"Authorization": "Basic dXNlcjpwYXNz"}) as refused:
        assert refused.status == 401
        assert (await refused.json())["error"]["code"] == "invalid_api_key"
    assert sum(p.value for p in telemetry.metric_points(sc.METRIC_AUTH_FAILURES)) == 1
