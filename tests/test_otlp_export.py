"""End to end: a real gateway process exports spans and metrics over OTLP/HTTP to a local receiver."""

from __future__ import annotations

import asyncio

import openai

from llmgw.storage import api_keys
from llmgw.telemetry import semconv as sc
from tests.fake_venice import FAKE_VENICE_KEY, FakeVenice
from tests.otlp_receiver import OtlpReceiver
from tests.processes import clean_env, free_port, start_gateway, stop


async def test_spans_and_metrics_reach_an_otlp_receiver(
    receiver: OtlpReceiver, fake_venice: FakeVenice, database_url: str, db
) -> None:
    issued = await api_keys.create_key(db, api_keys.KeySettings(name="otlp"))
    env = clean_env(
        DATABASE_URL=database_url,
        VENICE_API_KEY=FAKE_VENICE_KEY,
        VENICE_BASE_URL=fake_venice.base_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_SERVICE_NAME="llmgw-under-test",
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_METRIC_EXPORT_INTERVAL="500",
    )
    port = free_port()
    gateway = await asyncio.to_thread(start_gateway, env, port)
    try:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=issued.plaintext, max_retries=0
        )
        messages = [{"role": "user", "content": "count to three"}]
        await client.chat.completions.create(model="qwen3-5-9b", messages=messages)
        stream = await client.chat.completions.create(
            model="qwen3-5-9b", messages=messages, stream=True
        )
        async for _ in stream:
            pass
        await client.close()
    finally:
        assert await asyncio.to_thread(stop, gateway) == 0  # shutdown flushes the exporters

    spans = receiver.span_attributes("chat qwen3-5-9b")
    assert len(spans) == 2
    plain, streamed = sorted(spans, key=lambda a: a.get(sc.GEN_AI_REQUEST_STREAM, False))
    for attributes in (plain, streamed):
        assert attributes[sc.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
        assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
        assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
        assert attributes["venice.cost.usd"] > 0
    assert streamed[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] > 0
    assert all(
        span.kind == span.SPAN_KIND_CLIENT
        for span in receiver.spans
        if span.name.startswith("chat")
    )
    assert {"service.name": "llmgw-under-test"}.items() <= receiver.resources[0].items()

    names = {metric.name for metric in receiver.metrics}
    assert {sc.METRIC_OPERATION_DURATION, sc.METRIC_TOKEN_USAGE} <= names
    everything = str(receiver.spans) + str(receiver.metrics)
    assert issued.plaintext not in everything
    assert FAKE_VENICE_KEY not in everything
    assert "count to three" not in everything
