"""A stream whose usage never comes is charged an estimate: flagged on the span and the ledger,
and charged to the key's tokens per minute and its subject's budget."""

from __future__ import annotations

import uuid

from llmgw import app_keys
from llmgw.accounting.estimate import estimate_input_tokens
from tests.conftest import Gateway, eventually

MESSAGES = [{"role": "user", "content": "hi"}]


async def test_a_mid_stream_hang_up_is_charged_an_estimate(gateway: Gateway) -> None:
    subject = uuid.uuid4()
    await gateway.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 100)", subject
    )
    key = await gateway.create_key(subject_id=subject, tokens_per_minute=100_000)
    await gateway.hang_up_mid_stream(key)
    await eventually(
        lambda: any(s.name == "chat qwen3-5-9b" for s in gateway.telemetry.finished_spans())
    )
    span = gateway.telemetry.span("chat qwen3-5-9b")
    estimated_input = estimate_input_tokens({"messages": MESSAGES})
    assert span.attributes["llmgw.usage.source"] == "estimated"
    assert span.attributes["gen_ai.usage.input_tokens"] == estimated_input
    assert "venice.cost.usd" not in span.attributes  # no cost was reported
    limits = gateway.server.app[app_keys.LIMITS]
    assert await limits.flush()
    assert await gateway.server.app[app_keys.LEDGER].flush()
    row = await gateway.db.fetchrow("SELECT * FROM usage_events")
    assert (row["status"], row["input_tokens"], row["cost_computed"]) == (
        499,
        estimated_input,
        True,
    )
    assert row["cost_usd"] > 0
    counters = await gateway.db.fetch("SELECT counter, used, reserved FROM limit_counters")
    used = {c["counter"].split(":")[0]: (float(c["used"]), float(c["reserved"])) for c in counters}
    tokens = float(row["input_tokens"] + row["output_tokens"])
    assert used["tokens"] == (tokens, 0.0)
    assert used["budget"] == (float(row["cost_usd"]), 0.0)
