"""The Redis rate-limit backend: the same exact semantics and headers as Postgres."""

from __future__ import annotations

import asyncio
import logging
import os
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.conftest import Gateway
from tests.processes import free_port
from tests.stall_proxy import StallProxy

REDIS_URL = os.environ.get("LLMGW_TEST_REDIS_URL")
pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(not REDIS_URL, reason="set LLMGW_TEST_REDIS_URL to test Redis"),
]
BODY = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}


async def post(session: aiohttp.ClientSession, gateway: Gateway, key: str) -> tuple[int, dict]:
    async with session.post(
        gateway.url("/v1/chat/completions"), json=BODY, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        await response.read()
        return response.status, dict(response.headers)


async def test_redis_limit_is_exact_across_two_gateways(start_gateway) -> None:
    gateways = [
        await start_gateway(rate_limit_backend="redis", redis_url=REDIS_URL) for _ in range(2)
    ]
    key = await gateways[0].create_key(rate_limit_requests=10, rate_limit_window_seconds=60)
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(post(session, gateways[i % 2], key) for i in range(30)))
    assert sorted(status for status, _ in results) == [200] * 10 + [429] * 20
    ok = next(headers for status, headers in results if status == 200)
    refused = next(headers for status, headers in results if status == 429)
    assert ok["x-ratelimit-limit-requests"] == "10"
    assert refused["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(refused["Retry-After"]) <= 60


async def test_unreachable_redis_fails_closed_with_503(start_gateway) -> None:
    gateway = await start_gateway(rate_limit_backend="redis", redis_url="redis://127.0.0.1:9/0")
    key = await gateway.create_key()
    async with aiohttp.ClientSession() as session:
        status, _ = await post(session, gateway, key)
    assert status == 503
    assert gateway.fake.received == []


async def readyz(session: aiohttp.ClientSession, gateway: Gateway) -> tuple[int, dict]:
    async with session.get(gateway.url("/readyz")) as response:
        return response.status, await response.json()


async def test_readyz_and_the_log_follow_an_outage_of_redis(
    start_gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis behind a port nobody listens on yet, then reachable there: /readyz says which, and
    the outage is logged once when it is first met and once when it ends, however many requests."""
    assert REDIS_URL is not None
    caplog.set_level(logging.WARNING, logger="llmgw.limits.redis")
    redis = urlsplit(REDIS_URL)
    port = free_port()
    gateway = await start_gateway(
        rate_limit_backend="redis", redis_url=redis._replace(netloc=f"127.0.0.1:{port}").geturl()
    )
    key = await gateway.create_key()
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            status, body = await readyz(session, gateway)
            assert status == 503
            assert body["error"]["message"] == "Not ready: the rate-limit store does not answer."
            assert body["error"]["code"] == "rate_limit_store_unavailable"
            assert (await post(session, gateway, key))[0] == 503
        proxy = StallProxy(redis.hostname or "127.0.0.1", redis.port or 6379)
        await proxy.start(port)
        try:
            assert (await readyz(session, gateway)) == (200, {"status": "ready"})
            assert (await post(session, gateway, key))[0] == 200
        finally:
            await proxy.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "llmgw.limits.redis"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the rate-limit store (Redis) cannot be reached (ConnectionError")
    assert lines[1].startswith("the rate-limit store (Redis) answers again after")
    assert all(
        r.levelno == logging.WARNING for r in caplog.records if r.name == "llmgw.limits.redis"
    )
