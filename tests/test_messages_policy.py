"""/v1/messages under the same keys, limits, allowlists, budgets, telemetry and ledger as chat."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import aiohttp
import anthropic
import pytest
from opentelemetry.trace import SpanKind

from llmgw import app_keys
from llmgw.telemetry import semconv as sc
from tests.conftest import Gateway
from tests.fake_venice import expected_cost_usd

MODEL = "qwen3-5-9b"
MESSAGES: Any = [{"role": "user", "content": "three words here"}]  # 3 prompt tokens at the fake


async def create(client: anthropic.AsyncAnthropic, *, stream: bool) -> anthropic.types.Message:
    if not stream:
        return await client.messages.create(model=MODEL, max_tokens=50, messages=MESSAGES)
    async with client.messages.stream(model=MODEL, max_tokens=50, messages=MESSAGES) as events:
        return await events.get_final_message()


@pytest.mark.parametrize("stream", [False, True])
async def test_span_and_ledger_row_like_a_chat_completion(
    gateway: Gateway, api_key: str, stream: bool
) -> None:
    message = await create(gateway.anthropic_client(api_key), stream=stream)
    assert message.usage.output_tokens == 5

    span = gateway.telemetry.span(f"chat {MODEL}")
    attributes = dict(span.attributes)
    assert span.kind == SpanKind.CLIENT
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] == 50
    assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert attributes["venice.cost.usd"] == pytest.approx(expected_cost_usd(3, 5))
    assert attributes.get(sc.GEN_AI_REQUEST_STREAM, False) is stream
    server = gateway.telemetry.span("POST /v1/messages")
    assert span.parent.span_id == server.context.span_id

    assert await gateway.server.app[app_keys.LEDGER].flush()
    row = await gateway.db.fetchrow(
        "SELECT operation, model, stream, status, input_tokens, output_tokens, cost_usd "
        "FROM usage_events"
    )
    assert dict(row) == {
        "operation": "chat",
        "model": MODEL,
        "stream": stream,
        "status": 200,
        "input_tokens": 3,
        "output_tokens": 5,
        "cost_usd": Decimal(str(expected_cost_usd(3, 5))),
    }


async def test_budget_refusal_is_an_anthropic_rate_limit_error(gateway: Gateway) -> None:
    subject = uuid.uuid4()
    await gateway.db.execute(
        "INSERT INTO subjects (subject_id, monthly_budget_usd) VALUES ($1, 0.001)", subject
    )
    client = gateway.anthropic_client(await gateway.create_key(subject_id=subject))
    with pytest.raises(anthropic.RateLimitError) as refused:
        for _ in range(10):  # 0.00075 USD per request at the fake: the second one passes the line
            await create(client, stream=False)
            assert await gateway.server.app[app_keys.LEDGER].flush()
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "resets on" in body["error"]["message"]


async def test_refusals_before_the_handler_are_in_anthropic_shape(gateway: Gateway) -> None:
    """401 from the auth middleware, 404/405 from the router, 415 and 400 from the body reader."""
    async with aiohttp.ClientSession() as session:
        cases = [
            ("POST", "/v1/messages", {}, b"{}", 401, "authentication_error"),
            ("GET", "/v1/messages", {"x-api-key": "k"}, b"", 401, "authentication_error"),
        ]
        key = await gateway.create_key()
        cases += [
            ("GET", "/v1/messages", {"x-api-key": key}, b"", 405, "invalid_request_error"),
            ("POST", "/v1/messages/nope", {"x-api-key": key}, b"{}", 404, "not_found_error"),
            (
                "POST",
                "/v1/messages",
                {"x-api-key": key, "Content-Type": "text/plain"},
                b"hi",
                415,
                "invalid_request_error",
            ),
            (
                "POST",
                "/v1/messages/count_tokens",
                {"x-api-key": key, "Content-Type": "application/json"},
                b"[1]",
                400,
                "invalid_request_error",
            ),
        ]
        for method, path, headers, data, status, kind in cases:
            async with session.request(
                method, gateway.url(path), headers=headers, data=data
            ) as response:
                body = await response.json()
            assert response.status == status, (path, body)
            assert body == {
                "type": "error",
                "error": {"type": kind, "message": body["error"]["message"]},
            }
            assert body["error"]["message"]
