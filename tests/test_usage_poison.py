"""Poison from a caller or a provider never stops the usage ledger, and budgets hold afterwards."""

from __future__ import annotations

import asyncio
import uuid
from decimal import Decimal
from typing import Any

import aiohttp
import orjson
import pytest

from llmgw import app_keys
from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway
from tests.fake_venice import Behaviour
from tests.processes import clean_env
from tests.processes import run_llmgw as llmgw
from tests.test_policy_and_ledger import COST, chat, flush, send_many, settle
from tests.usage_records import unsanitized, usage_record

# What a hostile (or broken) upstream can answer; each is played once as JSON, once streamed.
UPSTREAM_POISON: dict[str, Behaviour] = {
    "negative tokens": Behaviour(
        billing={"usage": {"prompt_tokens": -5, "completion_tokens": -3, "total_tokens": -8}}
    ),
    "tokens over 2^31": Behaviour(
        billing={"usage": {"prompt_tokens": 2**31, "completion_tokens": 2**40, "total_tokens": 1}}
    ),
    "cost 1e10": Behaviour(
        billing={
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
            "cost": {"usd": 1e10, "diem": 1e10},
        }
    ),
    "status 999": Behaviour(status=999),
    "NUL in the response id": Behaviour(response_id="chatcmpl-\x00poison"),
}
POISON_FLAGS = {
    "negative tokens": ["input_tokens:out_of_range", "output_tokens:out_of_range"],
    "tokens over 2^31": ["input_tokens:out_of_range", "output_tokens:out_of_range"],
    "cost 1e10": ["cost_usd:out_of_range", "provider_extras:out_of_range"],
    "status 999": ["status:out_of_range"],
    "NUL in the response id": ["response_id:control_characters"],
}
ADMIN_TOKEN = "admin-token-for-poison-tests-0123"
CONTROL_CHARACTER_MODELS = ["ok\x00x", "ok\x1b[2Jx", "ok\nx", "ok\x7fx", "ok\x85x"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/v1/messages"])
async def test_a_model_with_a_control_character_is_refused_before_anything_else(
    gateway: Gateway, path: str
) -> None:
    key = await gateway.create_key()
    async with aiohttp.ClientSession() as session:
        for model in CONTROL_CHARACTER_MODELS:
            async with session.post(
                gateway.url(path),
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "input": "hi",
                    "max_tokens": 16,
                },
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                assert response.status == 400
                error = (await response.json())["error"]
            assert error["type"] == "invalid_request_error"
            assert "control characters" in error["message"]
            if path != "/v1/messages":  # Anthropic's error shape has no param
                assert error["param"] == "model"
    assert gateway.fake.received == []
    await flush(gateway)
    assert await gateway.db.fetchval("SELECT count(*) FROM usage_events") == 0


async def test_poison_then_100_ordinary_requests_leave_100_ordinary_rows(
    gateway: Gateway,
) -> None:
    key = await gateway.create_key(rate_limit_requests=10_000)
    key_id = await gateway.db.fetchval("SELECT id FROM api_keys")
    statuses: dict[tuple[str, bool], int] = {}
    async with aiohttp.ClientSession() as session:
        for model in CONTROL_CHARACTER_MODELS:  # from the caller: refused, so no row
            assert (await chat(session, gateway, key, model=model))[0] == 400
        for name, behaviour in UPSTREAM_POISON.items():
            for stream in (False, True):
                gateway.fake.enqueue(behaviour)
                statuses[(name, stream)] = (await chat(session, gateway, key, stream=stream))[0]
    assert await send_many(gateway, key, 100) == [200] * 100
    await flush(gateway)
    db = gateway.db
    assert statuses[("status 999", False)] == statuses[("status 999", True)] == 999
    assert await db.fetchval("SELECT count(*) FROM usage_dead_letters") == 0
    ordinary = await db.fetchrow(
        "SELECT count(*) AS rows, sum(input_tokens) AS input, sum(output_tokens) AS output, "
        "sum(cost_usd) AS cost FROM usage_events WHERE flags = '{}'"
    )
    assert (ordinary["rows"], ordinary["input"], ordinary["output"]) == (100, 300, 500)
    assert ordinary["cost"] == Decimal(str(COST)) * 100
    flagged = await db.fetch(
        "SELECT flags, stream, status, input_tokens, output_tokens, cost_usd, response_id, "
        "usage_source FROM usage_events WHERE flags <> '{}'"
    )
    assert sorted((row["flags"], row["stream"]) for row in flagged) == sorted(
        (POISON_FLAGS[name], stream) for name in UPSTREAM_POISON for stream in (False, True)
    )
    assert {row["status"] for row in flagged} == {200, None}
    # Counts that are no counts are billed the estimate instead (priced once the price table is
    # known: the very first request is not), a cost that is no cost the price table's.
    for row in flagged:
        if "input_tokens:out_of_range" in row["flags"]:
            assert row["usage_source"] == "estimated"
            assert row["input_tokens"] > 0 and row["output_tokens"] > 0
            assert row["cost_usd"] is None or row["cost_usd"] > 0
        elif row["status"] is not None:
            assert (row["usage_source"], row["cost_usd"]) == ("reported", Decimal(str(COST)))
    assert {row["response_id"] for row in flagged} >= {"chatcmpl-poison"}
    window = await db.fetchval(
        "SELECT sum(tokens) FROM api_key_token_windows WHERE api_key_id = $1", key_id
    )
    # 8 tokens per ordinary row, per "cost 1e10" row and per "NUL in the response id" row, and
    # the estimates billed for the counts that were no counts.
    estimates = sum(
        row["input_tokens"] + row["output_tokens"]
        for row in flagged
        if "input_tokens:out_of_range" in row["flags"]
    )
    assert window == 100 * 8 + 2 * 8 + 2 * 8 + estimates


async def test_budgets_are_still_enforced_after_poison(gateway: Gateway) -> None:
    subject = uuid.uuid4()
    await gateway.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 0.01)", subject
    )
    key = await gateway.create_key(subject_id=subject)
    async with aiohttp.ClientSession() as session:
        # max_tokens bounds each request's worst case, which the budget reserves before the call.
        for behaviour in UPSTREAM_POISON.values():
            for stream in (False, True):
                gateway.fake.enqueue(behaviour)
                await chat(session, gateway, key, stream=stream, max_tokens=5)
        outcomes: list[tuple[int, Any]] = []
        for _ in range(40):
            await settle(gateway)
            outcomes.append(await chat(session, gateway, key, max_tokens=5))
            if outcomes[-1][0] != 200:
                break
        status, body = outcomes[-1]
        assert (status, body["error"]["code"]) == (429, "budget_exceeded")
        # Everything settled and written, the poison did not stop the counting: still refused.
        await settle(gateway)
        await flush(gateway)
        assert (await chat(session, gateway, key, max_tokens=5))[0] == 429
    assert len(outcomes) > 1  # ordinary requests were admitted after the poison, until the cap
    spent = await gateway.db.fetchval("SELECT spend_usd FROM subject_monthly_spend")
    assert spent <= Decimal("0.01")
    # The running total the budget reads is the ledger's own sum: no row was held back.
    assert spent == await gateway.db.fetchval(
        "SELECT sum(cost_usd) FROM usage_events WHERE subject_id = $1", subject
    )


async def test_venice_costs_are_summed_exactly(start_gateway: Any) -> None:
    gateway = await start_gateway(admin_token=ADMIN_TOKEN)
    key = await gateway.create_key(subject_id=uuid.uuid4(), rate_limit_requests=10_000)
    venice_cost = 0.00010471875  # what Venice bills 1117 input tokens at $0.09375 per million
    billing = {
        "usage": {"prompt_tokens": 1117, "completion_tokens": 0, "total_tokens": 1117},
        "cost": {"usd": venice_cost, "diem": venice_cost},
    }
    gateway.fake.enqueue(*(Behaviour(billing=billing) for _ in range(60)))
    assert await send_many(gateway, key, 60) == [200] * 60
    await flush(gateway)
    exact = Decimal("0.00010471875") * 60
    row = await gateway.db.fetchrow(
        "SELECT sum(cost_usd) AS usd, min(cost_usd) AS one, "
        "sum((provider_extras ->> 'venice.cost.diem')::numeric) AS diem FROM usage_events"
    )
    assert (row["one"], row["usd"], row["diem"]) == (Decimal("0.00010471875"), exact, exact)
    assert await gateway.db.fetchval("SELECT spend_usd FROM subject_monthly_spend") == exact
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            gateway.url("/admin/v1/usage"), headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as response,
    ):
        report = await response.read()
    # The report's JSON number is the exact sum, digit for digit (summed as floats: 0.006283124999999991).
    assert b'"cost_usd":0.006283125,' in report
    # So is each provider-reported extra's, summed by name.
    assert (
        b'"provider_extras":{"venice.cost.usd":0.006283125,"venice.cost.diem":0.006283125}'
        in report
    )


async def test_a_refused_row_is_counted_and_shown_to_the_operator(
    gateway: Gateway, database_url: str
) -> None:
    ledger = gateway.server.app[app_keys.LEDGER]
    ledger.record(unsanitized(usage_record(request_id="refused"), operation="images\x00"))
    ledger.record(usage_record(request_id="fine"))
    await flush(gateway)
    assert await gateway.db.fetchval("SELECT request_id FROM usage_events") == "fine"
    points = gateway.telemetry.metric_points(sc.METRIC_USAGE_LEDGER_DEAD_LETTERS)
    assert sum(point.value for point in points) == 1
    result = await asyncio.to_thread(
        llmgw, "usage", "dead-letters", "--limit", "5", env=clean_env(DATABASE_URL=database_url)
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    letter = orjson.loads(line)
    assert (letter["request_id"], letter["error_type"]) == (
        "refused",
        "CharacterNotInRepertoireError",
    )
    assert letter["record"]["operation"] == "images\x00"  # as it was, escaped in the JSON
    assert line.isascii()


# A hostile answer in a translated API: what the caller is shown, and what the ledger keeps.
TRANSLATED = {
    "/v1/messages": {"max_tokens": 16, "messages": [{"role": "user", "content": "add 4 and 6"}]},
    "/v1/responses": {"input": "add 4 and 6"},
}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}}}
TOOLS = {
    "/v1/messages": [{"name": "add", "input_schema": ADD}],
    "/v1/responses": [{"type": "function", "name": "add", "parameters": ADD}],
}


async def translated(
    gateway: Gateway, key: str, path: str, *, stream: bool, tools: bool
) -> tuple[int, bytes]:
    body = {"model": "qwen3-5-9b", "stream": stream, **TRANSLATED[path]}
    if tools:
        body["tools"] = TOOLS[path]
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url(path), json=body, headers={"x-api-key": key}) as response,
    ):
        return response.status, await response.read()


def documents(status: int, raw: bytes, stream: bool) -> list[Any]:
    """The answer, or each event's data, as JSON."""
    if not stream:
        return [orjson.loads(raw)]
    assert status == 200
    return [
        orjson.loads(line[len(b"data: ") :])
        for line in raw.split(b"\n")
        if line.startswith(b"data: ")
    ]


def counts(value: Any, *, in_usage: bool = False) -> list[Any]:
    """Every token count in a ``usage`` object anywhere in ``value``."""
    found = []
    if isinstance(value, dict):
        for name, inner in value.items():
            if in_usage and name.endswith("_tokens"):
                found.append(inner)
            found.extend(counts(inner, in_usage=in_usage or name == "usage"))
    elif isinstance(value, list):
        for inner in value:
            found.extend(counts(inner, in_usage=in_usage))
    return found


def tool_names(value: Any) -> list[Any]:
    """The name of every tool_use block and function_call item anywhere in ``value``."""
    found = []
    if isinstance(value, dict):
        if value.get("type") in ("tool_use", "function_call"):
            found.append(value.get("name"))
        for inner in value.values():
            found.extend(tool_names(inner))
    elif isinstance(value, list):
        for inner in value:
            found.extend(tool_names(inner))
    return found


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", sorted(TRANSLATED))
@pytest.mark.parametrize("nameless", ["empty", "missing"])
async def test_a_tool_call_naming_no_tool_is_the_providers_failure_never_a_nameless_block(
    gateway: Gateway, path: str, stream: bool, nameless: Any
) -> None:
    key = await gateway.create_key()
    gateway.fake.enqueue(Behaviour(nameless_tool_call=nameless))
    status, raw = await translated(gateway, key, path, stream=stream, tools=True)
    answers = documents(status, raw, stream)
    assert all(name for name in tool_names(answers))
    last = answers[-1]
    if not stream:
        assert status == 502
        message = last["error"]["message"]
    elif path == "/v1/messages":
        assert last["type"] == "error" and last["error"]["type"] == "api_error"
        message = last["error"]["message"]
    else:
        assert [a["type"] for a in answers[-2:]] == ["error", "response.failed"]
        message = answers[-2]["message"]
    assert "names no tool" in message
    await flush(gateway)
    row = await gateway.db.fetchrow("SELECT status, error_type, input_tokens FROM usage_events")
    # The provider worked (and billed): its usage is kept, the failure recorded.
    assert (row["status"], row["error_type"]) == (
        200 if stream else 502,
        "upstream_invalid_response",
    )


@pytest.mark.parametrize(
    ("usage", "flags"),
    [
        # Neither count is one: as if no usage came (a whole Responses answer shows none).
        (
            {"prompt_tokens": -5, "completion_tokens": 2.5, "total_tokens": -8},
            ["input_tokens:out_of_range"],
        ),
        # One is: the other shows 0.
        (
            {"prompt_tokens": 3, "completion_tokens": -2, "total_tokens": 1},
            ["output_tokens:out_of_range"],
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", sorted(TRANSLATED))
async def test_negative_or_fractional_usage_is_never_shown(
    gateway: Gateway, path: str, stream: bool, usage: dict[str, Any], flags: list[str]
) -> None:
    key = await gateway.create_key()
    gateway.fake.enqueue(Behaviour(billing={"usage": usage}))
    status, raw = await translated(gateway, key, path, stream=stream, tools=False)
    assert status == 200
    shown = counts(documents(status, raw, stream))
    assert all(isinstance(n, int) and n >= 0 for n in shown), shown
    assert shown or (path, stream, usage["prompt_tokens"]) == ("/v1/responses", False, -5)
    await flush(gateway)
    row = await gateway.db.fetchrow("SELECT flags FROM usage_events")
    assert row["flags"] == flags  # the ledger says what it dropped
