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


SLICE_SECONDS = 2.0


@pytest.fixture
def two_leased_gateways(database_url: str, fake_venice: FakeVenice) -> Iterator[list[Any]]:
    """Two gateways with capacity leases on (``LIMIT_SLICE_REQUESTS``), short slice leases."""
    env = clean_env(
        DATABASE_URL=database_url,
        VENICE_API_KEY=FAKE_VENICE_KEY,
        VENICE_BASE_URL=fake_venice.base_url,
        LIMIT_SLICE_REQUESTS="64",
        LIMIT_SLICE_BUSY_RATE="0",  # every key, not only busy ones
        LIMIT_SLICE_SECONDS=str(SLICE_SECONDS),
    )
    ports = [free_port(), free_port()]
    processes = [start_gateway(env, port) for port in ports]
    yield [
        (process, f"http://127.0.0.1:{port}")
        for process, port in zip(processes, ports, strict=True)
    ]
    for process in processes:
        stop(process)


async def test_a_killed_replicas_unused_window_slice_comes_back_when_its_lease_expires(
    two_leased_gateways: list[Any], db: asyncpg.Connection
) -> None:
    """Issue 34 item 11: a replica SIGKILLed while busy holding a window slice."""
    issued = await api_keys.create_key(
        db,
        api_keys.KeySettings(name="sliced", rate_limit_requests=40, rate_limit_window_seconds=600),
    )
    (killed, first), (_, second) = two_leased_gateways
    async with aiohttp.ClientSession() as session:
        # Busy until it is killed (an idle replica gives its unused slices back by itself).
        counter = f"window:{issued.record.id}:600:%"

        async def holds_a_spare_slice() -> bool:
            used, held = await db.fetchrow(
                "SELECT coalesce(sum(used), 0)::float8, coalesce(sum(reserved), 0)::float8 "
                "FROM limit_counters WHERE counter LIKE $1",
                counter,
            )
            return bool(used + held > admitted)

        admitted = 0
        for sent in range(36):  # over a few of its ticks (0.25 s), within the key's 40
            admitted += await post(session, first, issued.plaintext) == 200
            if sent >= 25:
                # Frozen, so what the store shows is what it holds when it is killed: killed once
                # that is more than it used (a tick may just have given every slice back).
                killed.send_signal(signal.SIGSTOP)
                if await holds_a_spare_slice():
                    break
                killed.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.04)
        assert admitted == sent + 1
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        # What the store was told was used before the kill (each tick reports a window slice's
        # hits); the rest of its slices is reserved under leases nobody renews any more.
        used, held = await db.fetchrow(
            "SELECT used::float8, reserved::float8 FROM limit_counters WHERE counter LIKE $1",
            counter,
        )
        assert 0 < used <= admitted and used + held > admitted  # it held more than it used
        assert await post(session, second, issued.plaintext) == (200 if used + held < 40 else 429)

        async def expired() -> bool:
            return not await db.fetchval(
                "SELECT count(*) FROM limit_leases WHERE counter LIKE $1 "
                "AND expires_at >= clock_timestamp()",
                counter,
            )

        await eventually(expired, within=SLICE_SECONDS * 3, what="the killed replica's lease ends")
        statuses = await asyncio.gather(
            *(post(session, second, issued.plaintext) for _ in range(40))
        )
    later = statuses.count(200)
    assert later >= 40 - admitted - 1  # the unused part of its slice came back (less one above)
    assert used + later + (used + held < 40) == 40  # and what it used stays counted
