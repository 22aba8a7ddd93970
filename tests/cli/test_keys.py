"""``llmgw keys``: the whole key as a reference, refused settings, and expiry in the listing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.processes import clean_env, run_llmgw

# Each test runs llmgw's CLI as a process (a second or more each): run by .ci/run's `pytest -m slow`.
pytestmark = pytest.mark.slow


def create(env: dict[str, str], *args: str) -> str:
    created = run_llmgw("keys", "create", "--name", "cli", *args, env=env)
    assert created.returncode == 0, created.stderr
    return created.stdout.strip()


@pytest.mark.parametrize("action", ["revoke", "rotate"])
async def test_revoke_and_rotate_accept_the_whole_key(
    action: str, database_url: str, db: asyncpg.Connection
) -> None:
    env = clean_env(DATABASE_URL=database_url)
    key = create(env)
    done = run_llmgw("keys", action, key, env=env)
    assert done.returncode == 0, done.stderr
    assert await db.fetchval("SELECT is_active FROM api_keys WHERE prefix = $1", key[:12]) is False
    assert key not in done.stdout + done.stderr


async def test_a_key_that_only_shares_the_prefix_is_not_found(
    database_url: str, db: asyncpg.Connection
) -> None:
    env = clean_env(DATABASE_URL=database_url)
    key = create(env)
    forged = key[:12] + "x" * (len(key) - 12)
    refused = run_llmgw("keys", "revoke", forged, env=env)
    assert refused.returncode == 1
    assert refused.stderr.startswith("llmgw: no key matches the key given")
    assert forged[12:] not in refused.stderr, "a presented key is never echoed"
    assert await db.fetchval("SELECT is_active FROM api_keys") is True
    # The prefix and the id still find it.
    assert run_llmgw("keys", "rotate", key[:12], env=env).returncode == 0


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--name", ""], "--name: must not be empty"),
        (["--name", "   "], "--name: must not be empty"),
        (["--name", "x", "--expires-at", "2020-01-01T00:00:00Z"], "is not in the future"),
    ],
)
async def test_create_refuses_an_empty_name_and_a_past_expiry(
    args: list[str], complaint: str, database_url: str, db: asyncpg.Connection
) -> None:
    refused = run_llmgw("keys", "create", *args, env=clean_env(DATABASE_URL=database_url))
    assert refused.returncode == 2
    assert complaint in refused.stderr and "Traceback" not in refused.stderr
    assert await db.fetchval("SELECT count(*) FROM api_keys") == 0


async def test_list_shows_expiry(database_url: str, db: asyncpg.Connection) -> None:
    env = clean_env(DATABASE_URL=database_url)
    expires = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    create(env, "--expires-at", expires.isoformat())
    create(env)
    table = run_llmgw("keys", "list", env=env).stdout.splitlines()
    header = table[0].split()
    assert "EXPIRES" in header
    assert expires.isoformat(timespec="seconds") in table[1]
    assert "never" in table[2].split()
    listed = json.loads(run_llmgw("keys", "list", "--json", env=env).stdout)
    assert datetime.fromisoformat(listed[0]["expires_at"]) == expires


async def test_create_prints_the_limits_it_set_defaults_included(
    database_url: str, db: asyncpg.Connection
) -> None:
    env = clean_env(DATABASE_URL=database_url)
    default = run_llmgw("keys", "create", "--name", "defaults", env=env)
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip().startswith("llmg_")  # stdout is the key alone, for $(...)
    assert (
        "limits: 60 requests per 60 s; tokens per minute unlimited; concurrent requests "
        "unlimited; models any; expires never"
    ) in default.stderr
    assert "PATCH /admin/v1/keys/" in default.stderr
    chosen = run_llmgw(
        "keys", "create", "--name", "chosen", "--rate-limit-requests", "600",
        "--rate-limit-window-seconds", "10", "--tokens-per-minute", "50000",
        "--max-concurrent-requests", "4", "--allowed-model", "a", "--allowed-model", "b",
        env=env,
    )  # fmt: skip
    assert (
        "limits: 600 requests per 10 s; tokens per minute 50000; concurrent requests 4; "
        "models a, b; expires never"
    ) in chosen.stderr
