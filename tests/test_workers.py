"""``serve --workers 2``: one address, two worker processes under a supervisor, behaving like replicas."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest

from llmgw.storage import api_keys
from tests.conftest import (
    GatewayProcess,
    PostgresServer,
    StartGateways,
    gateway_env,
    spawn_gateway,
)
from tests.fake_venice import Behaviour, FakeVenice
from tests.processes import eventually, free_port

# Supervisors and their worker processes, restarted and killed: pytest -m slow.
pytestmark = pytest.mark.slow

BODY = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}


def worker_pids(gateway: GatewayProcess, number: int) -> list[int]:
    """The PIDs worker ``number`` has served with, oldest first (from the workers' own lines,
    which ``wait_until_serving`` waits for: the supervisor's may be a batch behind them)."""
    found = re.findall(rf"worker {number} serving \(pid (\d+)\)", gateway.log_text())
    return [int(pid) for pid in found]


async def wait_until_serving(gateway: GatewayProcess, *times: int, timeout: float = 60) -> None:
    """Until worker n has said it is serving ``times[n-1]`` times."""

    def serving() -> bool:
        text = gateway.log_text()
        counts = [text.count(f"worker {n} serving") for n in range(1, len(times) + 1)]
        return gateway.running() and all(map(int.__ge__, counts, times))

    await eventually(serving, within=timeout, what=f"workers serving {times} times")


@pytest.fixture
async def supervisor(
    gateway_processes: StartGateways, database_url: str, fake_venice: FakeVenice
) -> GatewayProcess:
    (gateway,) = gateway_processes(
        gateway_env(database_url, fake_venice.base_url, LLMGW_WORKERS="2")
    )
    await wait_until_serving(gateway, 1, 1)
    return gateway


async def post(base: str, key: str, body: dict[str, Any] = BODY) -> tuple[int, str]:
    """One request on a connection of its own (the kernel picks the worker per connection)."""
    request_id = uuid.uuid4().hex
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.post(
            f"{base}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": request_id},
        ) as response,
    ):
        await response.read()
        return response.status, request_id


async def workers_of(gateway: GatewayProcess, request_ids: list[str]) -> Counter[Any]:
    """Which worker billed each request; a billing line is written within a flush interval."""
    wanted = set(request_ids)

    def billed() -> Counter[Any]:
        records = gateway.billing_records()
        return Counter(r.get("worker") for r in records if r["request_id"] in wanted)

    await eventually(lambda: billed().total() == len(wanted), within=10)
    return billed()


async def test_two_workers_serve_and_one_limit_is_exact_across_them(
    supervisor: GatewayProcess, db: asyncpg.Connection
) -> None:
    issued = await api_keys.create_key(
        db, api_keys.KeySettings(name="w", rate_limit_requests=20, rate_limit_window_seconds=60)
    )
    results = await asyncio.gather(*(post(supervisor.url, issued.plaintext) for _ in range(40)))
    assert sorted(status for status, _ in results) == [200] * 20 + [429] * 20
    served = [request_id for status, request_id in results if status == 200]
    assert sum((await workers_of(supervisor, served)).values()) == 20
    # Both workers answered (the kernel spreads the connections), though one may have served
    # none of the 20 the limit let through: a worker slower to its first admissions (a loaded
    # machine, a key not yet in its cache) can find them all taken by the other. Each worker
    # logs its first refusal of a kind at once, with the request's id.
    asked = {request_id for _, request_id in results}

    def answered() -> set[Any]:
        return {
            record.get("worker")
            for record in supervisor.records()
            if record.get("event") in ("llmgw.billing", "request.refused")
            and record.get("request_id") in asked
        }

    # (Each worker writes its lines within its own flush interval.)
    await eventually(lambda: answered() == {1, 2}, within=10, what="lines of both workers")


async def test_a_killed_worker_is_replaced(
    supervisor: GatewayProcess, db: asyncpg.Connection
) -> None:
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="w"))).plaintext
    (first,) = worker_pids(supervisor, 1)
    os.kill(first, signal.SIGKILL)
    await wait_until_serving(supervisor, 2, 1)
    (_, replacement) = worker_pids(supervisor, 1)
    assert replacement != first
    results = await asyncio.gather(*(post(supervisor.url, key) for _ in range(30)))
    assert {status for status, _ in results} == {200}
    assert (await workers_of(supervisor, [request_id for _, request_id in results]))[1] > 0


async def open_stream(session: aiohttp.ClientSession, base: str, key: str) -> Any:
    response = await session.post(
        f"{base}/v1/chat/completions",
        json={**BODY, "stream": True},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": uuid.uuid4().hex},
    )
    assert response.status == 200
    await response.content.readline()
    return response


async def test_sigterm_drains_both_workers(
    supervisor: GatewayProcess, db: asyncpg.Connection, fake_venice: FakeVenice
) -> None:
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="w"))).plaintext
    streams = 16
    fake_venice.enqueue(*(Behaviour(chunk_delay=0.3) for _ in range(streams)))
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        responses = await asyncio.gather(
            *(open_stream(session, supervisor.url, key) for _ in range(streams))
        )
        supervisor.process.send_signal(signal.SIGTERM)
        bodies = await asyncio.gather(*(response.read() for response in responses))
    assert all(body.rstrip().endswith(b"data: [DONE]") for body in bodies)
    assert await asyncio.to_thread(supervisor.process.wait, 20) == 0
    records = [r for r in supervisor.billing_records() if r.get("outcome") == "completed"]
    assert len(records) == streams
    assert {r["worker"] for r in records} == {1, 2}


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.hostname else ""
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


async def test_supervisor_exits_non_zero_when_workers_cannot_start(
    postgres_server: PostgresServer, database_url: str, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    # A role the supervisor can check the schema with (one connection), but whose connection
    # limit leaves no room for a worker's pool: every worker fails at start.
    role = f"llmgw_one_connection_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
        await admin.execute(f"GRANT SELECT ON alembic_version TO {role}")
        env = gateway_env(as_role(database_url, role), fake_venice.base_url, LLMGW_WORKERS="2")
        gateway = spawn_gateway(env, tmp_path / "supervisor.log", free_port())
        try:
            code = await asyncio.to_thread(gateway.process.wait, 120)
        finally:
            gateway.stop()
        assert code != 0
        text = gateway.log_text()
        assert "at start 3 times in a row; giving up" in text
        assert "could not start: TooManyConnectionsError" in text
        assert "Traceback" not in text
    finally:
        await admin.execute(f"REVOKE ALL ON alembic_version FROM {role}")
        await admin.execute(f"DROP ROLE {role}")
        await admin.close()


async def test_a_worker_killed_right_after_its_answers_loses_no_ledger_row(
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    db: asyncpg.Connection,
    tmp_path: Path,
) -> None:
    """Rows are batched in memory; the worker's spool file keeps them when it is killed outright,
    and its replacement writes them (each once)."""
    (gateway,) = gateway_processes(
        gateway_env(
            database_url,
            fake_venice.base_url,
            LLMGW_WORKERS="2",
            LLMGW_DATA_DIR=str(tmp_path / "data"),
        )
    )
    await wait_until_serving(gateway, 1, 1)
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="w"))).plaintext
    locker = await asyncpg.connect(database_url)
    try:
        # The ledger cannot write while another session holds its table: every answered
        # request's row is still queued in its worker when that worker is killed.
        async with locker.transaction():
            await locker.execute("LOCK TABLE usage_events IN ACCESS EXCLUSIVE MODE")
            results = await asyncio.gather(*(post(gateway.url, key) for _ in range(30)))
            answered = [request_id for status, request_id in results if status == 200]
            assert len(answered) == 30
            assert (await workers_of(gateway, answered))[1] > 0
            (victim,) = worker_pids(gateway, 1)
            os.kill(victim, signal.SIGKILL)
    finally:
        await locker.close()
    await wait_until_serving(gateway, 2, 1)

    async def stored() -> list[str]:
        rows = await db.fetch("SELECT request_id FROM usage_events")
        return sorted(row["request_id"] for row in rows)

    async def every_answered_row_once() -> bool:
        return await stored() == sorted(answered)

    await eventually(every_answered_row_once, within=15, what="every answered request's row")
    assert "were found in its spool; they are written now" in gateway.log_text()
