"""Validation, content types, body limits, request ids, health, models and the route table."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw.app import create_app
from llmgw.routes import PUBLIC_PATHS
from tests.conftest import Gateway, eventually, make_settings, make_telemetry
from tests.fake_venice import Behaviour

MESSAGES = [{"role": "user", "content": "hi"}]


async def raw_post(
    gateway: Gateway,
    key: str,
    data: bytes,
    content_type: str = "application/json",
    path: str = "/v1/chat/completions",
    **kwargs,
) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": content_type}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url(path), data=data, headers=headers, **kwargs) as response,
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


def messages_body(size: int, **fields: object) -> bytes:
    """A Messages request of about ``size`` bytes (one long user turn)."""
    body = {
        "model": "qwen3-5-9b",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "x" * size}],
        **fields,
    }
    return orjson.dumps(body)


async def test_messages_and_responses_take_their_own_larger_limits_by_default(
    gateway: Gateway, api_key: str
) -> None:
    big = 3 * 1024 * 1024  # a long Claude Code session; three times REQUEST_BODY_LIMIT_BYTES
    status, _, answer = await raw_post(gateway, api_key, messages_body(big), path="/v1/messages")
    assert status == 200, answer
    assert len(gateway.fake.received[-1].json["messages"][0]["content"]) == big
    counted = await raw_post(gateway, api_key, messages_body(big), path="/v1/messages/count_tokens")
    assert counted[0] == 200
    responses = orjson.dumps({"model": "qwen3-5-9b", "input": "x" * big})
    status, _, answer = await raw_post(gateway, api_key, responses, path="/v1/responses")
    assert status == 200, answer
    chat = orjson.dumps(
        {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "x" * big}]}
    )
    status, _, answer = await raw_post(gateway, api_key, chat)
    assert status == 413
    assert "(REQUEST_BODY_LIMIT_BYTES)" in answer["error"]["message"]


@pytest.mark.parametrize("chunked", [False, True])
async def test_over_the_messages_limit_is_anthropics_request_too_large(
    start_gateway, api_key_for, chunked: bool
) -> None:
    gateway = await start_gateway(messages_body_limit_bytes=1000)
    key = await api_key_for(gateway)
    body = messages_body(2000)

    async def chunks():
        yield body[:500]
        yield body[500:]

    status, _, answer = await raw_post(
        gateway, key, chunks() if chunked else body, path="/v1/messages"
    )
    assert status == 413
    assert answer == {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "Request body is larger than the limit of 1000 bytes "
            "(MESSAGES_BODY_LIMIT_BYTES).",
        },
    }
    assert gateway.fake.received == []


async def test_over_the_responses_limit_is_413_naming_its_setting(
    start_gateway, api_key_for
) -> None:
    gateway = await start_gateway(responses_body_limit_bytes=1000)
    key = await api_key_for(gateway)
    body = orjson.dumps({"model": "qwen3-5-9b", "input": "x" * 2000})
    status, _, answer = await raw_post(gateway, key, body, path="/v1/responses")
    assert status == 413
    assert "(RESPONSES_BODY_LIMIT_BYTES)" in answer["error"]["message"]


async def test_bodies_past_the_memory_bound_wait_then_get_503_with_retry_after(
    start_gateway, api_key_for
) -> None:
    gateway = await start_gateway(request_body_memory_bytes=300_000)
    key = await api_key_for(gateway)
    holding = messages_body(200_000, stream=True)
    gateway.fake.enqueue(Behaviour(stall_after_chunks=1))
    async with aiohttp.ClientSession() as session:
        # A stream stalled upstream holds its body's share until it ends.
        first = await session.post(
            gateway.url("/v1/messages"),
            data=holding,
            headers={"x-api-key": key, "Content-Type": "application/json"},
        )
        assert first.status == 200
        await first.content.readline()
        started = asyncio.get_running_loop().time()
        status, headers, answer = await raw_post(
            gateway, key, messages_body(200_000), path="/v1/messages"
        )
        waited = asyncio.get_running_loop().time() - started
        first.close()
    assert status == 503
    assert headers["Retry-After"] == "2"
    assert answer["error"]["type"] == "overloaded_error"
    assert "REQUEST_BODY_MEMORY_BYTES" in answer["error"]["message"]
    assert 1.5 < waited < 4, "a brief wait for memory, then the refusal"
    assert len(gateway.fake.received) == 1, "the refused body never went upstream"
    # Once the stream ended, its share is free again.
    await eventually(lambda: gateway.fake.active_streams == 0)
    status, _, answer = await raw_post(gateway, key, messages_body(200_000), path="/v1/messages")
    assert status == 200, answer


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
