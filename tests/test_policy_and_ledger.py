"""Model allowlists, budgets, token limits, and the usage ledger that feeds them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from decimal import Decimal
from typing import Any

import aiohttp
import pytest

from llmgw import app_keys
from tests.conftest import Gateway
from tests.fake_venice import Behaviour, expected_cost_usd
from tests.processes import clean_env

MESSAGES = [{"role": "user", "content": "three words here"}]  # 3 prompt tokens at the fake
COST = expected_cost_usd(3, 5)  # the fake answers with 5 completion tokens


async def chat(
    session: aiohttp.ClientSession, gateway: Gateway, key: str, **body: Any
) -> tuple[int, dict[str, Any]]:
    async with session.post(
        gateway.url("/v1/chat/completions"),
        json={"model": "qwen3-5-9b", "messages": MESSAGES, **body},
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        raw = await response.read()
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, {"raw": raw}


async def send_many(gateway: Gateway, key: str, count: int) -> list[int]:
    """``count`` requests, every other one streamed, 32 at a time."""
    semaphore = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as session:

        async def one(index: int) -> int:
            async with semaphore:
                status, _ = await chat(session, gateway, key, stream=index % 2 == 1)
                return status

        return await asyncio.gather(*(one(index) for index in range(count)))


async def flush(gateway: Gateway) -> None:
    assert await gateway.server.app[app_keys.LEDGER].flush()


async def settle(gateway: Gateway) -> None:
    """Wait for the settlements of finished requests (they are sent in the background)."""
    assert await gateway.server.app[app_keys.LIMITS].flush()


async def test_a_key_limited_to_one_model_gets_403_for_another(gateway: Gateway) -> None:
    key = await gateway.create_key(allowed_models=("qwen3-5-9b",))
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, gateway, key))[0] == 200
        status, body = await chat(session, gateway, key, model="llama-3.3-70b")
    assert status == 403
    assert body["error"]["code"] == "model_not_allowed"
    assert body["error"]["param"] == "model"
    assert len(gateway.fake.received) == 1


async def test_models_lists_only_the_allowed_models(gateway: Gateway) -> None:
    key = await gateway.create_key(allowed_models=("qwen3-5-9b",))
    models = await gateway.client(key).models.list()
    assert [model.id for model in models.data] == ["qwen3-5-9b"]


async def test_subject_over_its_budget_gets_budget_exceeded(gateway: Gateway) -> None:
    subject = uuid.uuid4()
    await gateway.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 0.01)", subject
    )
    key = await gateway.create_key(subject_id=subject)
    limits = gateway.server.app[app_keys.LIMITS]
    await limits.prices.loaded()
    worst = limits.worst_case(
        {"messages": MESSAGES, "max_tokens": 5},
        gateway.server.app[app_keys.PROVIDERS].resolve("qwen3-5-9b").deployments,
        produces_output=True,
        priced=True,
        model="qwen3-5-9b",
    )
    assert worst.cost_usd is not None
    admitted = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(40):
            status, body = await chat(session, gateway, key, max_tokens=5)
            if status != 200:
                break
            admitted += 1
            await settle(gateway)
    assert status == 429
    assert body["error"]["code"] == "budget_exceeded"
    assert "resets on" in body["error"]["message"]
    # Admitted while what was spent plus this request's worst case fitted: never over the cap.
    spent = admitted * COST
    assert spent <= 0.01 < spent + worst.cost_usd
    await flush(gateway)
    ledger = await gateway.db.fetchval("SELECT spend_usd FROM subject_monthly_spend")
    assert ledger == Decimal(str(COST)) * admitted


async def test_tokens_per_minute_limit_is_charged_from_reported_usage(gateway: Gateway) -> None:
    # Worst case 17 tokens (12 estimated input + max_tokens 5); the fake reports 8 per request.
    key = await gateway.create_key(tokens_per_minute=40)
    statuses = []
    async with aiohttp.ClientSession() as session:
        for _ in range(4):
            statuses.append((await chat(session, gateway, key, max_tokens=5))[0])
            await settle(gateway)
        _, body = await chat(session, gateway, key, max_tokens=5)
    assert statuses == [200, 200, 200, 429]
    assert body["error"]["code"] == "tokens_per_minute_exceeded"


async def test_every_request_is_in_the_ledger_across_a_graceful_restart(
    start_gateway: Any, db: Any
) -> None:
    expected = {"rows": 0, "input": 0, "output": 0}
    key = None
    for _ in range(2):  # two gateway lifetimes; the first ends with a graceful shutdown
        gateway = await start_gateway()
        key = key or await gateway.create_key(rate_limit_requests=10_000)
        statuses = await send_many(gateway, key, 500)
        assert set(statuses) == {200}
        await gateway.server.close()  # runs the app's cleanup: the ledger writes what is queued
        expected["rows"] += 500
        expected["input"] += 500 * 3
        expected["output"] += 500 * 5
    row = await db.fetchrow(
        "SELECT count(*) AS rows, sum(input_tokens) AS input, sum(output_tokens) AS output, "
        "sum(cost_usd) AS cost, count(*) FILTER (WHERE stream) AS streams FROM usage_events"
    )
    assert (row["rows"], row["input"], row["output"]) == (
        expected["rows"],
        expected["input"],
        expected["output"],
    )
    assert row["streams"] == 500
    assert row["cost"] == Decimal(str(COST)) * 1000


async def test_ledger_rows_carry_what_the_billing_record_says(gateway: Gateway) -> None:
    key = await gateway.create_key(subject_id=uuid.uuid4())
    async with aiohttp.ClientSession() as session:
        await chat(session, gateway, key)
        await chat(session, gateway, key, model="venice-nonexistent-model")
    await flush(gateway)
    ok, failed = await gateway.db.fetch("SELECT * FROM usage_events ORDER BY status")
    assert ok["status"] == 200
    assert ok["response_id"].startswith("chatcmpl-")
    assert (ok["provider"], ok["model"], ok["operation"]) == ("venice", "qwen3-5-9b", "chat")
    assert ok["request_id"]
    assert failed["status"] == 404
    assert failed["error_type"] == "404"
    assert failed["input_tokens"] is None


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_venices_diem_cost_is_a_provider_reported_extra_in_the_ledger_and_the_span(
    gateway: Gateway, stream: bool
) -> None:
    billing = {
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        "cost": {"usd": 0.00010471875, "diem": 1.25},
    }
    gateway.fake.enqueue(Behaviour(billing=billing))
    key = await gateway.create_key()
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, gateway, key, stream=stream))[0] == 200
    await flush(gateway)
    row = await gateway.db.fetchrow(
        "SELECT cost_usd, provider_extras::text AS extras FROM usage_events"
    )
    assert row["cost_usd"] == Decimal("0.00010471875")
    assert json.loads(row["extras"]) == {"venice.cost.usd": 0.00010471875, "venice.cost.diem": 1.25}
    span = dict(gateway.telemetry.span("chat qwen3-5-9b").attributes)
    assert (span["venice.cost.usd"], span["venice.cost.diem"]) == (0.00010471875, 1.25)


async def test_usage_report_and_prune(start_gateway: Any, database_url: str) -> None:
    gateway = await start_gateway(admin_token="admin-token-for-tests-0123456789")
    key = await gateway.create_key()
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            await chat(session, gateway, key)
        await flush(gateway)
        async with session.get(
            gateway.url("/admin/v1/usage?group_by=model"),
            headers={"Authorization": "Bearer admin-token-for-tests-0123456789"},
        ) as response:
            report = await response.json()
        async with session.get(
            gateway.url("/admin/v1/usage?group_by=deployment"),
            headers={"Authorization": "Bearer admin-token-for-tests-0123456789"},
        ) as response:
            by_deployment = await response.json()
    assert [(row["deployment"], row["requests"]) for row in by_deployment["data"]] == [
        ("venice:qwen3-5-9b", 3)
    ]
    assert report["data"] == [
        {
            "model": "qwen3-5-9b",
            "requests": 3,
            "input_tokens": 9,
            "output_tokens": 15,
            "cost_usd": pytest.approx(3 * COST),
            "cache_hits": 0,
            "saved_cost_usd": 0,
            "provider_extras": {
                "venice.cost.usd": pytest.approx(3 * COST),
                "venice.cost.diem": 0,
            },
        }
    ]
    await gateway.db.execute("UPDATE usage_events SET occurred_at = now() - interval '40 days'")
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmgw", "usage", "prune", "--older-than-days", "30"],
        env=clean_env(DATABASE_URL=database_url),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "deleted 3" in result.stdout
    assert await gateway.db.fetchval("SELECT count(*) FROM usage_events") == 0


async def test_a_budgeted_key_calling_an_unpriced_model_gets_price_unknown(
    gateway: Gateway,
) -> None:
    subject = uuid.uuid4()
    await gateway.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 10)", subject
    )
    key = await gateway.create_key(subject_id=subject)
    async with aiohttp.ClientSession() as session:
        status, body = await chat(session, gateway, key, model="not-in-the-listing", max_tokens=5)
        assert (status, body["error"]["code"]) == (403, "price_unknown")
        assert (await chat(session, gateway, key, max_tokens=5))[0] == 200
    assert [r.path for r in gateway.fake.received if r.method == "POST"] == [
        "/api/v1/chat/completions"
    ]
