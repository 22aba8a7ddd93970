"""GenAI spans, metrics and billing records, read back from in-memory exporters."""

from __future__ import annotations

import json
import logging

import aiohttp
import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from llmgw.telemetry import semconv as sc
from llmgw.telemetry.logs import JsonFormatter
from tests.conftest import Gateway, eventually
from tests.fake_venice import Behaviour, expected_cost_usd

MESSAGES = [{"role": "user", "content": "secret prompt words"}]


def billing_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "llmgw.billing"]


async def test_plain_completion_span_has_the_genai_attributes(
    gateway: Gateway, api_key: str
) -> None:
    await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, max_tokens=50, temperature=0.5, top_p=0.9, seed=7
    )
    span = gateway.telemetry.span("chat qwen3-5-9b")
    attributes = dict(span.attributes)
    assert span.kind == SpanKind.CLIENT
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "venice"
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == "qwen3-5-9b"
    assert attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] == 50
    assert attributes[sc.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert attributes[sc.GEN_AI_REQUEST_TOP_P] == 0.9
    assert attributes[sc.GEN_AI_REQUEST_SEED] == 7
    assert attributes[sc.SERVER_ADDRESS] == "127.0.0.1"
    assert attributes[sc.SERVER_PORT] == gateway.fake.port
    assert attributes[sc.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
    assert attributes[sc.GEN_AI_RESPONSE_MODEL] == "qwen3-5-9b"
    assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert attributes["venice.cost.usd"] == pytest.approx(expected_cost_usd(3, 5))
    assert attributes["venice.cost.diem"] == 0
    assert attributes[sc.LLMGW_RETRY_COUNT] == 0
    assert sc.GEN_AI_REQUEST_STREAM not in attributes
    assert sc.GEN_AI_INPUT_MESSAGES not in attributes

    server = gateway.telemetry.span("POST /v1/chat/completions")
    assert server.kind == SpanKind.SERVER
    assert span.parent.span_id == server.context.span_id


async def test_streamed_span_has_usage_cost_and_time_to_first_chunk_without_asking(
    gateway: Gateway, api_key: str
) -> None:
    stream = await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    async for _ in stream:
        pass
    attributes = dict(gateway.telemetry.span("chat qwen3-5-9b").attributes)
    assert attributes[sc.GEN_AI_REQUEST_STREAM] is True
    assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert attributes["venice.cost.usd"] == pytest.approx(expected_cost_usd(3, 5))
    assert attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] > 0
    assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert attributes[sc.LLMGW_STREAM_OUTCOME] == "completed"


@pytest.mark.parametrize("placement", ["separate", "finish"])
async def test_usage_is_read_from_whichever_chunk_carries_it(
    gateway: Gateway, api_key: str, placement: str
) -> None:
    gateway.fake.usage_placement = placement
    stream = await gateway.client(api_key).chat.completions.create(
        model="mistral-small-3-2-24b-instruct", messages=MESSAGES, stream=True
    )
    async for _ in stream:
        pass
    attributes = dict(gateway.telemetry.span("chat mistral-small-3-2-24b-instruct").attributes)
    assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5


async def test_failures_record_error_type_and_retries(gateway: Gateway, api_key: str) -> None:
    gateway.fake.fail_times(3, status=503)
    with pytest.raises(openai.InternalServerError):
        await gateway.client(api_key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    span = gateway.telemetry.span("chat qwen3-5-9b")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "503"
    assert span.attributes[sc.LLMGW_RETRY_COUNT] == 2
    [retries] = gateway.telemetry.metric_points(sc.METRIC_UPSTREAM_RETRIES)
    assert retries.value == 2


async def test_auth_and_rate_limit_refusals_are_on_the_server_span(gateway: Gateway) -> None:
    key = await gateway.create_key(rate_limit_requests=1)
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {key}"}):
            async with session.post(
                gateway.url("/v1/chat/completions"),
                json={"model": "m", "messages": MESSAGES},
                headers=headers,
            ) as response:
                await response.read()
    errors = [
        span.attributes.get(sc.ERROR_TYPE)
        for span in gateway.telemetry.finished_spans()
        if span.kind == SpanKind.SERVER
    ]
    assert errors == ["invalid_api_key", None, "rate_limit_exceeded"]
    assert gateway.telemetry.metric_points(sc.METRIC_AUTH_FAILURES)[0].value == 1
    assert gateway.telemetry.metric_points(sc.METRIC_RATE_LIMIT_REFUSALS)[0].value == 1


async def test_cancelled_stream_is_recorded_as_cancelled(gateway: Gateway, api_key: str) -> None:
    await gateway.hang_up_mid_stream(api_key)
    await eventually(
        lambda: any(s.name == "chat qwen3-5-9b" for s in gateway.telemetry.finished_spans())
    )
    attributes = dict(gateway.telemetry.span("chat qwen3-5-9b").attributes)
    assert attributes[sc.LLMGW_STREAM_OUTCOME] == "cancelled"
    assert attributes[sc.ERROR_TYPE] == "cancelled"


async def test_failed_stream_is_recorded_as_failed(gateway: Gateway, api_key: str) -> None:
    # Dropped again when asked for the rest (the continuation): the stream fails.
    gateway.fake.enqueue(Behaviour(drop_after_chunks=2), Behaviour(drop_after_chunks=1))
    stream = await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    attributes = dict(gateway.telemetry.span("chat qwen3-5-9b").attributes)
    assert attributes[sc.LLMGW_STREAM_OUTCOME] == "failed"
    assert attributes[sc.ERROR_TYPE] == "upstream_stream_interrupted"
    assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("error",)


async def test_metrics_have_convention_names_units_buckets_and_attributes(
    gateway: Gateway, api_key: str
) -> None:
    client = gateway.client(api_key)
    await client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    stream = await client.chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    async for _ in stream:
        pass
    durations = gateway.telemetry.metric_points(sc.METRIC_OPERATION_DURATION)
    assert sum(point.count for point in durations) == 2
    assert tuple(durations[0].explicit_bounds) == sc.DURATION_BUCKETS
    attributes = durations[0].attributes
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attributes[sc.GEN_AI_PROVIDER_NAME] == "venice"
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == "qwen3-5-9b"
    assert attributes[sc.GEN_AI_RESPONSE_MODEL] == "qwen3-5-9b"
    tokens = gateway.telemetry.metric_points(sc.METRIC_TOKEN_USAGE)
    by_type = {point.attributes[sc.GEN_AI_TOKEN_TYPE]: point for point in tokens}
    assert by_type["input"].sum == 6
    assert by_type["output"].sum == 10
    assert tuple(by_type["input"].explicit_bounds) == sc.TOKEN_BUCKETS
    [ttfc] = gateway.telemetry.metric_points(sc.METRIC_TIME_TO_FIRST_CHUNK)
    assert ttfc.count == 1
    [per_chunk] = gateway.telemetry.metric_points(sc.METRIC_TIME_PER_OUTPUT_CHUNK)
    assert per_chunk.count >= 5
    for name in (sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE, sc.METRIC_GATEWAY_REQUESTS):
        for point in gateway.telemetry.metric_points(name):
            assert not any(
                "key" in attribute or "subject" in attribute for attribute in point.attributes
            )
    [cost] = gateway.telemetry.metric_points(sc.METRIC_PROVIDER_COST)
    assert cost.value == pytest.approx(2 * expected_cost_usd(3, 5))


async def test_content_is_absent_by_default(
    gateway: Gateway, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await gateway.client(api_key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    everything = " ".join(str(s.attributes) for s in gateway.telemetry.finished_spans())
    everything += " ".join(JsonFormatter().format(r) for r in caplog.records)
    assert "secret prompt words" not in everything
    assert "Hello from fake Venice" not in everything
    assert api_key not in everything


async def test_content_is_recorded_when_enabled(start_gateway, api_key_for) -> None:
    gateway = await start_gateway(capture_genai_content=True)
    key = await api_key_for(gateway)
    stream = await gateway.client(key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    async for _ in stream:
        pass
    attributes = dict(gateway.telemetry.span("chat qwen3-5-9b").attributes)
    assert json.loads(attributes[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "secret prompt words"}]}
    ]
    assert json.loads(attributes[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Hello from fake Venice!"}],
            "finish_reason": "stop",
        }
    ]


async def test_one_billing_record_per_request_also_for_streams(
    gateway: Gateway, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw.billing")
    client = gateway.client(api_key)
    await client.chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    stream = await client.chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    async for _ in stream:
        pass
    plain, streamed = billing_records(caplog)
    key_id = str(await gateway.db.fetchval("SELECT id FROM api_keys"))
    for record, is_stream in ((plain, False), (streamed, True)):
        line = json.loads(JsonFormatter().format(record))
        assert line["api_key_id"] == key_id
        assert line["stream"] is is_stream
        assert line["input_tokens"] == 3
        assert line["output_tokens"] == 5
        assert line["cost_usd"] == pytest.approx(expected_cost_usd(3, 5))
        assert line["status"] == 200
        assert line["response_id"].startswith("chatcmpl-")
        assert len(line["trace_id"]) == 32
        assert line["request_id"]
        assert {"timestamp", "level", "message"} <= set(line)
        assert api_key not in json.dumps(line)
    assert json.loads(JsonFormatter().format(streamed))["time_to_first_chunk_ms"] > 0


async def test_traceparent_from_the_caller_is_continued_and_propagated(
    gateway: Gateway, api_key: str
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "qwen3-5-9b", "messages": MESSAGES},
            headers={
                "Authorization": f"Bearer {api_key}",
                "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
            },
        ) as response:
            assert response.status == 200
    span = gateway.telemetry.span("chat qwen3-5-9b")
    assert format(span.context.trace_id, "032x") == trace_id
    sent = gateway.fake.received[-1].headers["traceparent"]
    assert sent.split("-")[1] == trace_id
    assert sent.split("-")[2] == format(span.context.span_id, "016x")


async def test_prometheus_metrics_are_served_when_enabled(start_gateway, api_key_for) -> None:
    gateway = await start_gateway(prometheus=True)
    key = await api_key_for(gateway)
    await gateway.client(key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url("/metrics")) as response:
            text = await response.text()
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
    assert "gen_ai_client_operation_duration_seconds_bucket" in text
    assert 'gen_ai_provider_name="venice"' in text
    assert key not in text


async def test_metrics_route_is_absent_by_default(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url("/metrics")) as response:
            assert response.status == 404
            assert "LLMGW_PROMETHEUS" in (await response.json())["error"]["message"]
