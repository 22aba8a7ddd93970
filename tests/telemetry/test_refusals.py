"""Every refused request leaves one log line; a storm of the same refusal is folded into a count.

The folding runs on an injected clock (no sleeps); the lines of real refusals (401, 413, 429, a 400
of the gateway's own) come from a gateway on a loopback port.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest

from llmgw.telemetry.logs import JsonFormatter
from llmgw.telemetry.refusals import Refusal, RefusalLog
from tests.conftest import Gateway
from tests.processes import Clock

LOGGER = "llmgw.refusals"


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The refusal lines logged so far, as the gateway writes them; then forgets them."""
    found = [
        orjson.loads(JsonFormatter().format(record))
        for record in caplog.records
        if record.name == LOGGER
    ]
    caplog.clear()
    return found


def kind(line: dict[str, Any]) -> tuple[Any, ...]:
    return (line["route"], line["status"], line["code"], line["key_prefix"], line.get("repeats"))


@pytest.fixture
def refusal_lines(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


def test_the_first_of_a_kind_is_logged_at_once_and_repeats_are_counted_per_window(
    refusal_lines: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    refusals = RefusalLog(window_seconds=60, clock=clock)
    limited = Refusal("/v1/chat/completions", 429, "rate_limit_exceeded", "llmg_aaaaaaa", 1.5)
    other_key = Refusal("/v1/chat/completions", 429, "rate_limit_exceeded", "llmg_bbbbbbb", 2.0)

    refusals.record(limited)
    [first] = lines(refusal_lines)
    assert first["event"] == "request.refused" and first["level"] == "info"
    assert kind(first) == ("/v1/chat/completions", 429, "rate_limit_exceeded", "llmg_aaaaaaa", None)
    assert first["duration_ms"] == 1.5

    for _ in range(49):
        clock.now += 1
        refusals.record(limited)
    clock.now += 1
    refusals.record(other_key)  # another key's refusals are their own kind: logged at once
    assert [kind(line)[3] for line in lines(refusal_lines)] == ["llmg_bbbbbbb"]

    clock.now = 1000.0 + 59.9
    refusals.sweep()
    assert lines(refusal_lines) == []  # the window is still open
    clock.now = 1000.0 + 60.0
    refusals.sweep()
    [summary] = lines(refusal_lines)
    assert kind(summary) == (
        "/v1/chat/completions",
        429,
        "rate_limit_exceeded",
        "llmg_aaaaaaa",
        49,
    )
    assert summary["window_seconds"] == 60

    refusals.record(limited)  # a new window: logged at once again
    assert [kind(line)[4] for line in lines(refusal_lines)] == [None]
    refusals.record(limited)
    refusals.close()  # stopping: what was counted is logged, the window not ended yet
    assert [kind(line)[3:] for line in lines(refusal_lines)] == [("llmg_aaaaaaa", 1)]


def test_a_window_without_repeats_ends_silently_and_5xx_are_warnings(
    refusal_lines: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    refusals = RefusalLog(window_seconds=10, clock=clock)
    refusals.record(Refusal("/v1/models", 503, "database_unavailable", None, 2000.0))
    [line] = lines(refusal_lines)
    assert line["level"] == "warning" and line["key_prefix"] is None
    clock.now += 10
    refusals.record(Refusal("/v1/models", 503, "database_unavailable", None, 2000.0))
    assert [line.get("repeats") for line in lines(refusal_lines)] == [None]  # no empty summary


def test_kinds_beyond_the_bound_are_folded_into_one_per_route_status_and_code(
    refusal_lines: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    refusals = RefusalLog(window_seconds=60, max_kinds=2, clock=clock)
    for prefix in ("llmg_0000001", "llmg_0000002", "llmg_0000003", "llmg_0000004"):
        refusals.record(Refusal("/v1/chat/completions", 401, "invalid_api_key", prefix, 0.2))
    assert [line["key_prefix"] for line in lines(refusal_lines)] == [
        "llmg_0000001",
        "llmg_0000002",
        "*",
    ]
    refusals.close()
    assert [kind(line)[3:] for line in lines(refusal_lines)] == [("*", 1)]


# ---------------------------------------------------------------------------------------------
# End to end: the line of each refusal a gateway answers


async def send(gateway: Gateway, key: str, body: bytes, path: str = "/v1/chat/completions") -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gateway.url(path),
            data=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        ) as response:
            await response.read()
            return response.status


CHAT = b'{"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}'


async def test_a_401_is_logged_with_the_presented_prefix_never_the_key(
    gateway: Gateway, refusal_lines: pytest.LogCaptureFixture
) -> None:
    wrong = "llmg_wrongPrefixAndSecret0123456789abcdefghijk"
    assert await send(gateway, wrong, CHAT) == 401
    assert await send(gateway, "not-a-gateway-key-0123456789", CHAT) == 401
    first, second = lines(refusal_lines)
    assert kind(first) == ("/v1/chat/completions", 401, "invalid_api_key", wrong[:12], None)
    assert second["key_prefix"] is None  # not a gateway key: nothing of it is logged
    assert first["duration_ms"] >= 0
    assert wrong[12:] not in orjson.dumps(first).decode()


async def test_a_413_a_429_and_a_gateway_400_each_leave_a_line(
    start_gateway: Any, refusal_lines: pytest.LogCaptureFixture
) -> None:
    gateway = await start_gateway(request_body_limit_bytes=1000)
    key = await gateway.create_key(rate_limit_requests=3, rate_limit_window_seconds=60)
    prefix = key[:12]
    assert await send(gateway, key, b'{"model": ') == 400
    assert await send(gateway, key, b'{"x": "' + b"x" * 2000 + b'"}') == 413
    assert await send(gateway, key, CHAT) == 200
    assert await send(gateway, key, CHAT) == 429
    assert await send(gateway, key, CHAT) == 429  # the same again: folded
    route = "/v1/chat/completions"
    assert [kind(line) for line in lines(refusal_lines)] == [
        (route, 400, "invalid_request", prefix, None),
        (route, 413, "request_too_large", prefix, None),
        (route, 429, "rate_limit_exceeded", prefix, None),
    ]


async def test_a_refused_admin_token_is_never_logged_even_in_part(
    start_gateway: Any, refusal_lines: pytest.LogCaptureFixture
) -> None:
    gateway = await start_gateway(admin_token="llmg_the-admin-token-0123456789")
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gateway.url("/admin/v1/keys"),
            headers={"Authorization": "Bearer llmg_not-the-admin-token-0123456789"},
        ) as response:
            assert response.status == 401
    [line] = lines(refusal_lines)
    assert kind(line) == ("/admin/v1/keys", 401, "invalid_api_key", None, None)
