"""The ``llmgw`` command line against real databases: keys, db, and serve with embedded Postgres."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import asyncpg
import pytest

from llmgw.key_format import hash_key
from llmgw.storage import migrations
from tests.processes import clean_env, free_port, start_gateway, stop
from tests.processes import run_llmgw as llmgw

# Each test runs llmgw's CLI as a process (a second or more each): run by .ci/run's `pytest -m slow`.
pytestmark = pytest.mark.slow


async def test_keys_create_list_revoke_rotate(database_url: str, db: asyncpg.Connection) -> None:
    env = clean_env(DATABASE_URL=database_url)
    created = llmgw(
        "keys", "create", "--name", "demo", "--rate-limit-requests", "7",
        "--max-concurrent-requests", "3", env=env,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("llmg_") and len(key) >= 5 + 43

    row = await db.fetchrow("SELECT * FROM api_keys")
    assert row["prefix"] == key[:12] and bytes(row["key_hash"]) == hash_key(key)
    assert (row["rate_limit_requests"], row["max_concurrent_requests"]) == (7, 3)
    assert key not in " ".join(map(str, row.values()))

    listed = llmgw("keys", "list", "--json", env=env)
    assert listed.returncode == 0
    [record] = json.loads(listed.stdout)
    assert record["prefix"] == key[:12] and record["name"] == "demo"
    assert key not in listed.stdout
    assert "demo" in llmgw("keys", "list", env=env).stdout

    rotated = llmgw("keys", "rotate", key[:12], "--json", env=env)
    assert rotated.returncode == 0, rotated.stderr
    new = json.loads(rotated.stdout)
    assert new["key"] != key and new["rate_limit_requests"] == 7 and new["is_active"]
    assert new["max_concurrent_requests"] == 3
    assert await db.fetchval("SELECT is_active FROM api_keys WHERE prefix = $1", key[:12]) is False

    revoked = llmgw("keys", "revoke", new["id"], env=env)
    assert revoked.returncode == 0
    assert await db.fetchval("SELECT count(*) FROM api_keys WHERE is_active") == 0


async def test_known_dev_key_and_prefix_collision(
    database_url: str, db: asyncpg.Connection
) -> None:
    env = clean_env(DATABASE_URL=database_url)
    first = llmgw("keys", "create", "--name", "dev", "--key", "llmg_dev_0123456789abcdef", env=env)
    assert first.stdout.strip() == "llmg_dev_0123456789abcdef"
    again = llmgw("keys", "create", "--name", "dev2", "--key", "llmg_dev_0123456789abcdXX", env=env)
    assert again.returncode == 1
    assert "llmg_dev_012" in again.stderr and "Traceback" not in again.stderr
    missing = llmgw("keys", "revoke", "nosuchprefix", env=env)
    assert missing.returncode == 1 and "no key" in missing.stderr


def test_external_database_not_at_head_refuses_to_start(empty_database: str) -> None:
    result = llmgw("serve", env=clean_env(DATABASE_URL=empty_database, VENICE_API_KEY="x"))
    assert result.returncode == 1
    assert "alembic upgrade head" in result.stderr
    upgraded = llmgw("db", "upgrade", env=clean_env(DATABASE_URL=empty_database))
    assert upgraded.returncode == 0, upgraded.stderr
    current = llmgw("db", "current", env=clean_env(DATABASE_URL=empty_database))
    assert current.stdout.startswith(migrations.head_revision())


@pytest.mark.slow  # an embedded PostgreSQL from scratch
def test_embedded_database_serves_with_no_setup_and_keeps_keys(tmp_path: Path) -> None:
    env = clean_env(VENICE_API_KEY="x", LLMGW_DATA_DIR=str(tmp_path / "data"))
    port = free_port()
    gateway = start_gateway(env, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as response:
            assert json.load(response) == {"status": "ok"}
        created = llmgw("keys", "create", "--name", "while-serving", env=env)
        assert created.returncode == 0, created.stderr
    finally:
        assert stop(gateway) == 0
    assert "embedded PostgreSQL" in (gateway.stderr.read() if gateway.stderr else "")

    gateway = start_gateway(env, port)
    try:
        listed = llmgw("keys", "list", "--json", env=env)
        assert [k["name"] for k in json.loads(listed.stdout)] == ["while-serving"]
    finally:
        stop(gateway)


async def test_smoke_reports_a_plain_and_a_streamed_completion(gateway, api_key: str) -> None:
    result = await asyncio.to_thread(
        llmgw, "smoke", "--base-url", gateway.base_url, "--key", api_key, env=clean_env()
    )
    assert result.returncode == 0, result.stdout + result.stderr
    plain, streamed = result.stdout.strip().splitlines()
    assert plain.startswith("plain") and "status=200" in plain and "tokens=5/5" in plain
    assert (
        streamed.startswith("streamed") and "first_chunk=" in streamed and "tokens=5/5" in streamed
    )
    assert api_key not in result.stdout


async def test_smoke_fails_with_a_bad_key(gateway) -> None:
    result = await asyncio.to_thread(
        llmgw,
        "smoke",
        "--base-url",
        gateway.base_url,
        "--key",
        "llmg_wrong_key_0123456789",
        env=clean_env(),
    )
    assert result.returncode == 1
    assert "status=401" in result.stdout
