"""Two real gateway processes sharing one database: one exact limit, revocation seen by both,
and a graceful SIGTERM that lets an in-flight stream finish."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from llmgw.storage import api_keys
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.processes import clean_env, eventually, free_port, start_gateway, stop

BODY = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def two_gateways(database_url: str, fake_venice: FakeVenice) -> Iterator[list[Any]]:
    env = clean_env(
        DATABASE_URL=database_url,
        VENICE_API_KEY=FAKE_VENICE_KEY,
        VENICE_BASE_URL=fake_venice.base_url,
        SHUTDOWN_GRACE_SECONDS="10",
    )
    ports = [free_port(), free_port()]
    processes = [start_gateway(env, port) for port in ports]
    yield [
        (process, f"http://127.0.0.1:{port}")
        for process, port in zip(processes, ports, strict=True)
    ]
    for process in processes:
        stop(process)


async def post(session: aiohttp.ClientSession, base: str, key: str) -> int:
    async with session.post(
        f"{base}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
    ) as response:
        await response.read()
        return response.status


async def test_limit_is_exact_across_two_processes(
    two_gateways: list[Any], db: asyncpg.Connection
) -> None:
    issued = await api_keys.create_key(
        db,
        api_keys.KeySettings(name="shared", rate_limit_requests=10, rate_limit_window_seconds=60),
    )
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(
            *(post(session, two_gateways[i % 2][1], issued.plaintext) for i in range(30))
        )
    assert sorted(statuses) == [200] * 10 + [429] * 20


async def test_revocation_reaches_the_other_process_within_a_second(
    two_gateways: list[Any], db: asyncpg.Connection
) -> None:
    issued = await api_keys.create_key(db, api_keys.KeySettings(name="revoke-me"))
    (_, first), (_, second) = two_gateways
    async with aiohttp.ClientSession() as session:
        assert await post(session, first, issued.plaintext) == 200
        assert await post(session, second, issued.plaintext) == 200
        await api_keys.revoke_key(db, issued.record.prefix)

        async def refused() -> bool:
            return await post(session, second, issued.plaintext) == 401

        await eventually(refused, within=1.0, what="the other process refuses the revoked key")


async def test_sigterm_lets_an_in_flight_stream_finish(
    two_gateways: list[Any], db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    issued = await api_keys.create_key(db, api_keys.KeySettings(name="drain"))
    process, base = two_gateways[0]
    fake_venice.enqueue(Behaviour(chunk_delay=0.3))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base}/v1/chat/completions",
            json={**BODY, "stream": True},
            headers={"Authorization": f"Bearer {issued.plaintext}"},
        ) as response,
    ):
        assert response.status == 200
        await response.content.readline()
        process.send_signal(signal.SIGTERM)
        body = await response.read()
    assert body.rstrip().endswith(b"data: [DONE]")
    assert await asyncio.to_thread(process.wait, 15) == 0
