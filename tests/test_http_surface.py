"""Validation, content types, body limits, request ids, health, models and the route table."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.app import create_app
from llmgw.routes import PUBLIC_PATHS
from tests.conftest import Gateway, make_settings, make_telemetry

MESSAGES = [{"role": "user", "content": "hi"}]


async def raw_post(
    gateway: Gateway, key: str, data: bytes, content_type: str = "application/json", **kwargs
) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": content_type}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"), data=data, headers=headers, **kwargs
        ) as response,
    ):
        return response.status, dict(response.headers), await response.json()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"[1, 2]", None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "", "messages": [{"role": "user"}]}', "model"),
        (b'{"model": 7, "messages": [{"role": "user"}]}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": "hi"}', "messages"),
        (b'{"model": "m", "messages": ["hi"]}', "messages[0]"),
        (b'{"model": "m", "messages": [{"content": "hi"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
    ],
)
async def test_invalid_bodies_get_400_naming_the_field(
    gateway: Gateway, api_key: str, body: bytes, param: str | None
) -> None:
    status, _, answer = await raw_post(gateway, api_key, body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"].get("param") == param
    assert answer["error"]["message"]
    assert gateway.fake.received == []


async def test_invalid_json_is_400(gateway: Gateway, api_key: str) -> None:
    status, _, answer = await raw_post(gateway, api_key, b'{"model": ')
    assert status == 400
    assert "not valid JSON" in answer["error"]["message"]


async def test_non_json_content_type_is_415(gateway: Gateway, api_key: str) -> None:
    status, _, answer = await raw_post(
        gateway, api_key, b"model=x", "application/x-www-form-urlencoded"
    )
    assert status == 415
    assert answer["error"]["code"] == "unsupported_media_type"


async def test_body_over_the_limit_is_413_with_content_length(start_gateway, api_key_for) -> None:
    gateway = await start_gateway(request_body_limit_bytes=1000)
    key = await api_key_for(gateway)
    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 2000 + b'"}]}'
    status, _, answer = await raw_post(gateway, key, big)
    assert status == 413
    assert "1000" in answer["error"]["message"]


async def test_chunked_body_over_the_limit_is_413(start_gateway, api_key_for) -> None:
    gateway = await start_gateway(request_body_limit_bytes=1000)
    key = await api_key_for(gateway)

    async def chunks():
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"x" * 100
        yield b'"}]}'

    status, _, answer = await raw_post(gateway, key, chunks())
    assert status == 413
    assert answer["error"]["code"] == "request_too_large"
    assert gateway.fake.received == []


async def test_request_id_is_echoed_when_sane_and_made_otherwise(
    gateway: Gateway, api_key: str
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url("/healthz"), headers={"X-Request-Id": "abc-123"}) as r:
            assert r.headers["X-Request-Id"] == "abc-123"
        async with session.get(gateway.url("/healthz"), headers={"X-Request-Id": "bad id\t!"}) as r:
            assert r.headers["X-Request-Id"] != "bad id\t!"
            assert len(r.headers["X-Request-Id"]) == 32
        async with session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "m", "messages": MESSAGES, "stream": True},
            headers={"Authorization": f"Bearer {api_key}", "X-Request-Id": "stream-1"},
        ) as r:
            assert r.headers["X-Request-Id"] == "stream-1"
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert r.headers["X-Accel-Buffering"] == "no"
            assert r.headers["Cache-Control"] == "no-cache"


async def test_healthz_and_readyz(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url("/healthz")) as r:
            assert (r.status, await r.json()) == (200, {"status": "ok"})
        async with session.get(gateway.url("/readyz")) as r:
            assert r.status == 200


async def test_readyz_is_503_when_the_schema_is_not_at_head(
    fake_venice, empty_database: str
) -> None:
    settings = make_settings(fake_venice, empty_database)
    app = create_app(
        settings, database_url=empty_database, telemetry=make_telemetry(settings).telemetry
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/readyz")) as r:
                body = await r.json()
                assert r.status == 503
                assert "alembic upgrade head" in body["error"]["message"]
    finally:
        await server.close()


async def test_models_lists_venice_models_and_needs_a_key(gateway: Gateway, api_key: str) -> None:
    client = gateway.client(api_key)
    models = await client.models.list()
    assert "qwen3-5-9b" in {model.id for model in models.data}
    await client.models.list()
    assert sum(1 for r in gateway.fake.received if r.path.endswith("/models")) == 1, "not cached"
    async with aiohttp.ClientSession() as session, session.get(gateway.url("/v1/models")) as r:
        assert r.status == 401


async def test_every_non_public_route_requires_a_key(gateway: Gateway) -> None:
    app: web.Application = gateway.server.app
    async with aiohttp.ClientSession() as session:
        for resource in app.router.resources():
            path = resource.canonical
            for route in resource:
                if route.method == "HEAD":
                    continue
                async with session.request(route.method, gateway.url(path)) as r:
                    if path in PUBLIC_PATHS:
                        assert r.status != 401, path
                    else:
                        assert r.status == 401, (route.method, path)
                        error = (await r.json())["error"]
                        if path.startswith("/v1/messages"):  # Anthropic's error shape there
                            assert error["type"] == "authentication_error"
                        else:
                            assert error["code"] == "invalid_api_key"


async def test_unknown_route_and_wrong_method_are_openai_shaped(
    gateway: Gateway, api_key: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url("/v1/nope"), headers=headers) as r:
            assert r.status == 404
            assert (await r.json())["error"]["type"] == "invalid_request_error"
        async with session.get(gateway.url("/v1/chat/completions"), headers=headers) as r:
            assert r.status == 405
            assert (await r.json())["error"]["code"] == "method_not_allowed"


async def test_readyz_stays_ready_when_a_newer_release_migrated_the_schema(
    gateway: Gateway,
) -> None:
    current = await gateway.db.fetchval("SELECT version_num FROM alembic_version")
    await gateway.db.execute("UPDATE alembic_version SET version_num = 'f00dfeed9999'")
    try:
        async with aiohttp.ClientSession() as session, session.get(gateway.url("/readyz")) as r:
            assert r.status == 200
    finally:
        await gateway.db.execute("UPDATE alembic_version SET version_num = $1", current)
