"""``llmgw usage report`` and ``llmgw budgets``: the console's figures from the command line."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.conftest import Gateway
from tests.console.conftest import wait_for_usage
from tests.processes import clean_env
from tests.test_cli import llmgw

# Each test runs llmgw's CLI as a process (a second or more each): run by .ci/run's `pytest -m slow`.
pytestmark = pytest.mark.slow

ADMIN_TOKEN = "cli-parity-admin-token-0123456789"


async def test_usage_report_prints_what_the_admin_api_reports(
    start_gateway: Any, database_url: str
) -> None:
    gateway: Gateway = await start_gateway(admin_token=ADMIN_TOKEN)
    key = await gateway.create_key(name="reported")
    client = gateway.client(key)
    for model in ("qwen3-5-9b", "qwen3-5-9b", "llama-3.2-3b"):
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}]
        )
    await wait_for_usage(gateway.db, 3)
    env = clean_env(DATABASE_URL=database_url)
    today = datetime.now(UTC).date()
    window = ("--from", today.isoformat(), "--to", (today + timedelta(days=1)).isoformat())
    async with aiohttp.ClientSession() as session:
        for by in ("day", "model", "key", "subject"):
            printed = await asyncio.to_thread(
                llmgw, "usage", "report", "--by", by, *window, "--json", env=env
            )
            assert printed.returncode == 0, printed.stderr
            async with session.get(
                gateway.url("/admin/v1/usage/report"),
                params={"by": by, "from": window[1], "to": window[3]},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            ) as response:
                assert response.status == 200
                assert json.loads(printed.stdout) == (await response.json())["data"], by
    by_model = json.loads(
        (
            await asyncio.to_thread(
                llmgw, "usage", "report", "--by", "model", *window, "--json", env=env
            )
        ).stdout
    )
    assert [(row["model"], row["requests"]) for row in by_model] == [
        ("llama-3.2-3b", 1),
        ("qwen3-5-9b", 2),
    ]
    as_csv = await asyncio.to_thread(
        llmgw, "usage", "report", "--by", "model", *window, "--csv", env=env
    )
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [row["requests"] for row in rows] == ["1", "2"]
    table = await asyncio.to_thread(llmgw, "usage", "report", "--by", "model", *window, env=env)
    assert "qwen3-5-9b" in table.stdout and "requests" in table.stdout.splitlines()[0]
    bad = await asyncio.to_thread(
        llmgw, "usage", "report", "--from", "2026-02-01", "--to", "2026-01-01", env=env
    )
    assert bad.returncode == 2 and "from must be before to" in bad.stderr


async def test_budgets_set_show_and_clear(database_url: str, db: asyncpg.Connection) -> None:
    env = clean_env(DATABASE_URL=database_url)
    subject = str(uuid.uuid4())
    set_cap = await asyncio.to_thread(llmgw, "budgets", "set", subject, "12.5", env=env)
    assert set_cap.returncode == 0, set_cap.stderr
    assert json.loads(set_cap.stdout)["monthly_budget_usd"] == 12.5
    shown = json.loads((await asyncio.to_thread(llmgw, "budgets", "show", subject, env=env)).stdout)
    assert shown["monthly_budget_usd"] == 12.5 and shown["month_to_date_spend_usd"] == 0
    audit = await db.fetchrow("SELECT actor, action, target FROM admin_audit")
    assert tuple(audit) == ("cli", "subject.budget", subject)
    cleared = await asyncio.to_thread(llmgw, "budgets", "set", subject, "none", env=env)
    assert json.loads(cleared.stdout)["monthly_budget_usd"] is None
    for wrong in ("-1", "lots"):
        refused = await asyncio.to_thread(llmgw, "budgets", "set", subject, wrong, env=env)
        assert refused.returncode == 2 and refused.stderr.startswith("llmgw: ")
        assert "Traceback" not in refused.stderr


HOSTILE_MODELS = {
    '=HYPERLINK("https://evil.example","x")': '\'=HYPERLINK("https://evil.example","x")',
    "+1+cmd": "'+1+cmd",
    "-2+3": "'-2+3",
    "@SUM(A1)": "'@SUM(A1)",
    "\tlead-tab": "'\tlead-tab",
    "\rlead-cr": "'\rlead-cr",
    "qwen-=-plain": "qwen-=-plain",  # only the first character matters
}


async def test_csv_exports_neutralise_cells_a_spreadsheet_would_run(
    start_gateway: Any, database_url: str
) -> None:
    gateway: Gateway = await start_gateway(admin_token=ADMIN_TOKEN)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for model in HOSTILE_MODELS:
        await gateway.db.execute(
            "INSERT INTO usage_hourly (hour, api_key_id, model, subject_id, requests, errors,"
            " input_tokens, output_tokens, cost_usd, duration_ms_sum, latency_buckets)"
            " VALUES ($1, $2, $3, NULL, 1, 0, 1, 1, 0, 1, $4)",
            hour,
            uuid.uuid4(),
            model,
            [0] * 16,
        )
    day = hour.date()
    window = {"by": "model", "from": day.isoformat(), "to": (day + timedelta(days=1)).isoformat()}
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            gateway.url("/admin/v1/usage/report"),
            params={**window, "format": "csv"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        assert response.status == 200
        from_api = await response.text()
    from_cli = await asyncio.to_thread(
        llmgw,
        "usage", "report", "--by", "model", "--from", window["from"], "--to", window["to"], "--csv",
        env=clean_env(DATABASE_URL=database_url),
    )  # fmt: skip
    assert from_cli.returncode == 0, from_cli.stderr

    def models(exported: str) -> set[str]:
        return {row["model"] for row in csv.DictReader(io.StringIO(exported, newline=""))}

    assert models(from_api) == set(HOSTILE_MODELS.values())
    # Captured as text, the CLI's output has universal newlines: a lone CR reads as LF.
    assert models(from_cli.stdout) == {m.replace("\r", "\n") for m in HOSTILE_MODELS.values()}
