"""Several migrations at once against one database (replicas starting together, a Helm hook beside
a ``serve`` with LLMGW_AUTO_MIGRATE=true): one migrates, the others wait for its advisory lock and
find the schema at head; each says which it was, and a failed migration says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from llmgw.storage import revisions
from llmgw.storage.migrations import MIGRATION_LOCK_KEY
from tests.conftest import GatewayProcess, gateway_env, spawn_gateway
from tests.fake_venice import FakeVenice
from tests.processes import REPO_ROOT, clean_env, eventually, free_port, run_llmgw

HEAD = revisions.head_revision()


def _start(command: list[str], url: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        env=clean_env(DATABASE_URL=url, **extra),
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# Each command imports everything first, then waits at a gate (a line on stdin): the test opens
# the gates together, so the upgrades start within a millisecond of each other, not a Python
# start-up apart.
_GATE = "import sys, sqlalchemy, alembic.command, {module}; sys.stdin.readline(); "
DB_UPGRADE = [
    sys.executable,
    "-c",
    _GATE.format(module="llmgw.cli") + "sys.exit(llmgw.cli.main(['db', 'upgrade']))",
]
ALEMBIC_UPGRADE = [
    sys.executable,
    "-c",
    _GATE.format(module="alembic.config") + "sys.exit(alembic.config.main(['upgrade', 'head']))",
]


def _open(*processes: subprocess.Popen[str]) -> None:
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("\n")
    for process in processes:
        assert process.stdin is not None
        process.stdin.flush()


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out + err


async def _at(url: str) -> str | None:
    connection = await asyncpg.connect(url)
    try:
        return await revisions.current_revision(connection)
    finally:
        await connection.close()


async def test_two_db_upgrades_at_once_one_migrates_the_other_waits(empty_database: str) -> None:
    # Both start while the lock is held, so both are past their start-up and contend for it the
    # moment it is let go: the race the lock closes, every time rather than by chance.
    holder = await asyncpg.connect(empty_database)
    await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    first, second = _start(DB_UPGRADE, empty_database), _start(DB_UPGRADE, empty_database)

    async def both_wait() -> bool:
        waiting = await holder.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return bool(waiting == 2)

    _open(first, second)
    await eventually(both_wait, within=60, what="both upgrades wait for the lock")
    await holder.close()
    results = [_finish(first), _finish(second)]
    assert [code for code, _ in results] == [0, 0], results
    outputs = sorted(output for _, output in results)
    assert (
        sum(f"database upgraded to head ({HEAD}) from nothing (empty)" in o for o in outputs) == 1
    )
    assert sum(f"database already at {HEAD}" in o for o in outputs) == 1, outputs
    assert all("waiting for it" in o for o in outputs), outputs
    assert "Traceback" not in "".join(outputs)
    assert await _at(empty_database) == HEAD


@pytest.mark.parametrize("round_", range(3))
async def test_racing_upgrades_without_a_head_start_all_succeed(
    empty_database: str, round_: int
) -> None:
    # As replicas start: the Helm hook's command, alembic's own, and a third `db upgrade` (what
    # serve with LLMGW_AUTO_MIGRATE=true runs in a child process) at once.
    processes = [
        _start(DB_UPGRADE, empty_database),
        _start(ALEMBIC_UPGRADE, empty_database),
        _start(DB_UPGRADE, empty_database),
    ]
    _open(*processes)
    results = [_finish(process) for process in processes]
    assert [code for code, _ in results] == [0, 0, 0], results
    assert "Traceback" not in "".join(output for _, output in results)
    assert await _at(empty_database) == HEAD


def test_a_failed_migration_says_why(empty_database: str) -> None:
    # A table in the way of the first migration: Postgres refuses it, and the operator reads
    # Postgres's reason, not a traceback or SQLAlchemy's link to its error catalogue.
    import asyncio

    async def block() -> None:
        connection = await asyncpg.connect(empty_database)
        try:
            await connection.execute("CREATE TABLE api_keys (id int)")
        finally:
            await connection.close()

    asyncio.run(block())
    result = run_llmgw("db", "upgrade", env=clean_env(DATABASE_URL=empty_database))
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert "sqlalche.me" not in result.stderr
    assert 'relation "api_keys" already exists' in result.stderr, result.stderr
    assert result.stderr.startswith("llmgw: db upgrade head failed"), result.stderr


def test_a_failed_auto_migration_prints_the_cause(empty_database: str) -> None:
    import asyncio

    async def block() -> None:
        connection = await asyncpg.connect(empty_database)
        try:
            await connection.execute("CREATE TABLE api_keys (id int)")
        finally:
            await connection.close()

    asyncio.run(block())
    env = clean_env(DATABASE_URL=empty_database, LLMGW_AUTO_MIGRATE="true", VENICE_API_KEY="k")
    result = run_llmgw("serve", env=env, timeout=60)
    assert result.returncode != 0
    assert 'relation "api_keys" already exists' in result.stderr, result.stderr
    assert "sqlalche.me" not in result.stderr


def test_db_upgrade_waits_for_the_database_a_bounded_time() -> None:
    # Nothing listens on port 9: the wait ends after its bound with the reason.
    env = clean_env(DATABASE_URL="postgresql://llmgw@127.0.0.1:9/llmgw")
    result = run_llmgw("db", "upgrade", "--wait-for-database", "2", env=env)
    assert result.returncode == 1, result
    assert "cannot reach the database" in result.stderr
    assert "waited 2 s" in result.stderr, result.stderr


@pytest.mark.slow
async def test_two_serves_auto_migrating_one_database_at_once_both_turn_ready(
    empty_database: str, fake_venice: FakeVenice, tmp_path: Path
) -> None:
    env = gateway_env(empty_database, fake_venice.base_url, LLMGW_AUTO_MIGRATE="true")
    gateways = [spawn_gateway(env, tmp_path / f"gateway-{n}.log", free_port()) for n in range(2)]
    try:
        async with aiohttp.ClientSession() as session:

            async def ready(gateway: GatewayProcess) -> bool:
                assert gateway.running()
                try:
                    async with session.get(f"{gateway.url}/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            for gateway in gateways:
                await eventually(lambda g=gateway: ready(g), within=60, what="ready")
    finally:
        assert [gateway.stop() for gateway in gateways] == [0, 0]
    assert await _at(empty_database) == HEAD
