"""``llmgw teams``: the CLI mirrors /admin/v1/teams (create, list, show, update, delete), audited."""

from __future__ import annotations

import json

import asyncpg
import pytest

from tests.processes import clean_env, run_llmgw

pytestmark = pytest.mark.slow


async def test_teams_lifecycle_through_the_cli(database_url: str, db: asyncpg.Connection) -> None:
    env = clean_env(DATABASE_URL=database_url)
    made = run_llmgw(
        "teams", "create", "--name", "ml", "--budget-usd", "100", "--allowed-model", "m1",
        "--rate-limit-requests", "10", "--rate-limit-window-seconds", "60", env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    team = json.loads(made.stdout)
    assert (team["name"], team["monthly_budget_usd"], team["allowed_models"]) == ("ml", 100, ["m1"])

    listed = run_llmgw("teams", "list", env=env)
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [team["id"]]

    changed = run_llmgw(
        "teams", "update", team["id"], "--name", "ml-2", "--clear", "monthly_budget_usd", env=env
    )
    assert changed.returncode == 0, changed.stderr
    assert json.loads(run_llmgw("teams", "show", team["id"], env=env).stdout)["name"] == "ml-2"
    assert json.loads(changed.stdout)["monthly_budget_usd"] is None

    half = run_llmgw("teams", "update", team["id"], "--clear", "rate_limit_requests", env=env)
    assert half.returncode == 2 and "set (or cleared) together" in half.stderr

    await db.execute("INSERT INTO api_keys (name, prefix, key_hash, team_id) VALUES "
                     "('k', 'llmg_aaaaaaa', sha256('x'), $1)", team["id"].__str__())  # fmt: skip
    refused = run_llmgw("teams", "delete", team["id"], env=env)
    assert refused.returncode == 1 and "active key" in refused.stderr
    await db.execute("UPDATE api_keys SET is_active = false, revoked_at = now()")
    assert run_llmgw("teams", "delete", team["id"], env=env).returncode == 0
    actions = [r["action"] for r in await db.fetch("SELECT action FROM admin_audit ORDER BY id")]
    assert actions == ["team.create", "team.update", "team.delete"]
    missing = run_llmgw("teams", "show", team["id"], env=env)
    assert missing.returncode == 1 and "no team has id" in missing.stderr
