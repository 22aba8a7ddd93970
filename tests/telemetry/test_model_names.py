"""Metric attributes carry only model names the gateway knows; spans keep the name as sent."""

from __future__ import annotations

import aiohttp
import pytest

from llmgw.telemetry import model_names
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.model_names import OVERFLOW_MODEL_NAME, metric_model_name
from tests.conftest import Gateway

MESSAGES = [{"role": "user", "content": "hi"}]


async def chat(gateway: Gateway, key: str, model: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": model, "messages": MESSAGES},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        await response.read()
        return response.status


async def test_invented_model_names_share_one_metric_value(gateway: Gateway, api_key: str) -> None:
    invented = [f"nonexistent-model-{index}" for index in range(40)]
    for model in invented:
        assert await chat(gateway, api_key, model) == 404  # Venice does not know them
    assert await chat(gateway, api_key, "qwen3-5-9b") == 200
    durations = gateway.telemetry.metric_points(sc.METRIC_OPERATION_DURATION)
    labelled = {point.attributes[sc.GEN_AI_REQUEST_MODEL] for point in durations}
    assert labelled == {OVERFLOW_MODEL_NAME, "qwen3-5-9b"}
    assert metric_model_name("qwen3-5-9b") == "qwen3-5-9b"  # a name Venice answered
    # Spans keep what the client asked for.
    spans = {
        span.attributes.get(sc.GEN_AI_REQUEST_MODEL) for span in gateway.telemetry.finished_spans()
    }
    assert set(invented) <= spans


async def test_listed_models_and_aliases_are_known(gateway: Gateway, api_key: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            gateway.url("/v1/models"), headers={"Authorization": f"Bearer {api_key}"}
        ) as response,
    ):
        listed = [item["id"] for item in (await response.json())["data"]]
    assert listed
    assert all(metric_model_name(name) == name for name in listed)
    assert metric_model_name("never-listed-anywhere") == OVERFLOW_MODEL_NAME


def test_names_answered_with_success_are_known_while_few_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(model_names, "_answered", set())
    monkeypatch.setattr(model_names, "_MAX_ANSWERED", 1)
    assert metric_model_name("first") == OVERFLOW_MODEL_NAME  # not answered: not remembered
    assert metric_model_name("first", answered=True) == "first"
    assert metric_model_name("first") == "first"
    assert metric_model_name("second", answered=True) == OVERFLOW_MODEL_NAME  # no room left
