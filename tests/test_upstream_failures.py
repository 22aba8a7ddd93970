"""Retries, timeouts and broken upstreams: each ends in a clear answer, never a hang or a 500."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import openai
import pytest

from llmgw.config import venice_provider
from tests.conftest import Gateway, eventually, gateway_env
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice

MESSAGES = [{"role": "user", "content": "hi"}]


async def test_retryable_statuses_are_retried_until_success(gateway: Gateway, api_key: str) -> None:
    gateway.fake.fail_times(2, status=503)
    completion = await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES
    )
    assert completion.choices[0].message.content
    assert len(gateway.fake.received) == 3


async def test_exhausted_retries_return_venice_status_and_body(
    gateway: Gateway, api_key: str
) -> None:
    gateway.fake.fail_times(3, status=503)
    with pytest.raises(openai.InternalServerError) as caught:
        await gateway.client(api_key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert caught.value.status_code == 503
    assert caught.value.response.json() == {
        "error": "The model is at capacity. Please try again later."
    }
    assert len(gateway.fake.received) == 3


async def chat_answered(gateway: Gateway, key: str, behaviour: Behaviour) -> tuple[int, Any]:
    """One chat that the fake answers with ``behaviour``: the status and JSON body."""
    gateway.fake.enqueue(behaviour)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "qwen3-5-9b", "messages": MESSAGES},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize("status", [400, 402, 422])
async def test_other_4xx_are_never_retried(gateway: Gateway, api_key: str, status: int) -> None:
    answered, body = await chat_answered(gateway, api_key, Behaviour(status=status))
    assert answered == status
    assert "error" in body
    assert len(gateway.fake.received) == 1


async def test_retry_after_is_honoured(gateway: Gateway, api_key: str) -> None:
    gateway.fake.fail_times(1, status=429, retry_after="1")
    started = time.perf_counter()
    await gateway.client(api_key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert time.perf_counter() - started >= 1.0


async def test_reset_header_in_epoch_milliseconds_is_honoured(
    gateway: Gateway, api_key: str
) -> None:
    reset_ms = int((time.time() + 1.0) * 1000)
    gateway.fake.enqueue(Behaviour(status=429, ratelimit_reset_ms=reset_ms))
    started = time.perf_counter()
    await gateway.client(api_key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert time.perf_counter() - started >= 0.8


async def test_retry_hint_longer_than_the_timeout_is_not_waited_for(
    start_gateway, api_key_for
) -> None:
    gateway = await start_gateway(request_timeout_seconds=2.0)
    key = await api_key_for(gateway)
    gateway.fake.fail_times(1, status=429, retry_after="30")
    started = time.perf_counter()
    with pytest.raises(openai.RateLimitError) as caught:
        await gateway.client(key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert time.perf_counter() - started < 1.5
    # Venice's advice reaches the caller even when the gateway could not wait that long.
    assert caught.value.response.headers["Retry-After"] == "30"


async def test_stream_is_retried_before_the_first_byte(gateway: Gateway, api_key: str) -> None:
    gateway.fake.fail_times(1, status=502)
    stream = await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from fake Venice!"
    assert len(gateway.fake.received) == 2


async def test_stream_dropped_midway_and_again_when_continued_ends_with_an_error_event(
    gateway: Gateway, api_key: str
) -> None:
    # The only deployment is asked once more for the rest (tests/test_stream_continuation.py);
    # dropped that time too, the caller gets the failure.
    gateway.fake.enqueue(Behaviour(drop_after_chunks=2), Behaviour(drop_after_chunks=1))
    stream = await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as caught:
        async for chunk in stream:
            received.append(chunk)
    assert received, "chunks before the drop must reach the client"
    assert "broke off the stream" in caught.value.message
    assert len(gateway.fake.received) == 2, "one continuation, then the failure"


async def test_stream_idle_past_the_timeout_ends_with_an_error_event(
    start_gateway, api_key_for
) -> None:
    gateway = await start_gateway(request_timeout_seconds=1.0)
    key = await api_key_for(gateway)
    gateway.fake.enqueue(Behaviour(stall_after_chunks=2), Behaviour(stall_after_chunks=1))
    stream = await gateway.client(key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    started = time.perf_counter()
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert time.perf_counter() - started < 4
    assert "time" in caught.value.message.lower()


async def test_venice_error_event_mid_stream_reaches_the_client_as_is(
    gateway: Gateway, api_key: str
) -> None:
    # Its continuation fails the same way: the provider's own event is what the caller sees.
    gateway.fake.enqueue(
        Behaviour(error_event_after_chunks=1), Behaviour(error_event_after_chunks=1)
    )
    stream = await gateway.client(api_key).chat.completions.create(
        model="qwen3-5-9b", messages=MESSAGES, stream=True
    )
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert caught.value.message == "The model is currently overloaded."


async def test_client_disconnect_cancels_the_upstream_stream(
    gateway: Gateway, api_key: str
) -> None:
    await gateway.hang_up_mid_stream(api_key)
    await eventually(lambda: gateway.fake.cancelled_streams == 1)
    assert gateway.fake.active_streams == 0


async def test_venice_unreachable_is_502(start_gateway, api_key_for) -> None:
    gateway = await start_gateway(
        environment_provider=venice_provider(FAKE_VENICE_KEY, "http://127.0.0.1:9/api/v1"),
        upstream_max_retries=1,
    )
    key = await api_key_for(gateway)
    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.client(key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert caught.value.status_code == 502
    assert caught.value.response.json()["error"]["type"] == "upstream_error"


async def test_no_answer_within_the_timeout_is_504(start_gateway, api_key_for) -> None:
    gateway = await start_gateway(request_timeout_seconds=0.5)
    key = await api_key_for(gateway)
    gateway.fake.enqueue(Behaviour(delay_before_headers=3))
    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.client(key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert caught.value.status_code == 504
    assert caught.value.response.json()["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize("behaviour", [Behaviour(garbage=True), Behaviour(close_mid_body=True)])
async def test_garbage_or_truncated_body_is_502(
    start_gateway, api_key_for, behaviour: Behaviour
) -> None:
    gateway = await start_gateway(upstream_max_retries=0)
    key = await api_key_for(gateway)
    gateway.fake.enqueue(behaviour)
    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.client(key).chat.completions.create(model="qwen3-5-9b", messages=MESSAGES)
    assert caught.value.status_code == 502
    assert set(caught.value.response.json()["error"]) >= {"message", "type", "code"}


@pytest.mark.parametrize("status", [401, 403])
async def test_venice_refusing_the_gateways_key_is_a_502_naming_it(
    gateway: Gateway, api_key: str, status: int
) -> None:
    answered, body = await chat_answered(gateway, api_key, Behaviour(status=status))
    assert answered == 502
    error = body["error"]
    assert error["code"] == "upstream_auth_failed"
    assert "venice" in error["message"]
    assert "Authentication failed" not in error["message"]
    assert len(gateway.fake.received) == 1  # not retried


async def test_serve_warns_at_start_when_venice_refuses_its_key(
    gateway_processes, fake_venice: FakeVenice, database_url: str
) -> None:
    env = {
        **gateway_env(database_url, fake_venice.base_url),
        "VENICE_API_KEY": "a-wrong-venice-key",
    }
    (process,) = gateway_processes(env)
    await eventually(
        lambda: any(
            "provider venice refused the gateway's API key" in r.get("message", "")
            for r in process.records()
        ),
        within=10,
    )
    assert process.problems() == []
    assert "a-wrong-venice-key" not in process.log_text()
