"""Every way a request can end comes to one end: one settlement of what it reserved, one ledger
row, one span and one billing line, whatever the path (JSON, stream, Messages, a provider's
refusal, a cut, the caller leaving, a timeout, a cache hit, the server shutting down)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import attrs
import pytest

from llmgw.api import pipeline
from llmgw.limits.policy import Ticket
from llmgw.storage.ledger import UsageLedger
from llmgw.telemetry.genai import ChatObservation
from llmgw.usage_sink import BILLING_EVENT, UsageAccounting
from tests.conftest import Gateway
from tests.fake_venice import Behaviour
from tests.processes import eventually
from tests.test_policy_and_ledger import flush

HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": "qwen3-5-9b", "messages": HI}
SPEECH = {"model": "tts-kokoro", "voice": "af_sky", "input": "Hello"}
MESSAGES = {"model": "qwen3-5-9b", "messages": HI, "max_tokens": 16}


async def _post(gateway: Gateway, key: str, path: str, body: dict[str, Any]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url(path), json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        await response.read()


def _request(
    path: str, body: dict[str, Any], *behaviours: Behaviour
) -> Callable[[Gateway, str], Awaitable[None]]:
    async def send(gateway: Gateway, key: str) -> None:
        gateway.fake.enqueue(*behaviours)
        await _post(gateway, key, path, body)

    return send


async def _caller_leaves(gateway: Gateway, key: str) -> None:
    await gateway.hang_up_mid_stream(key)


async def _transcribe(gateway: Gateway, key: str) -> None:
    form = aiohttp.FormData()
    form.add_field("model", "openai/whisper-large-v3")
    form.add_field("file", b"RIFF\x24\x00\x00\x00WAVEfmt " * 8, filename="a.wav")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/audio/transcriptions"),
            data=form,
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        await response.read()


async def _row_cannot_be_computed(gateway: Gateway, key: str) -> None:
    """The ledger row's figures fail to compute: a bare row, flagged; the span an error."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "charge", _broken)
        await _post(gateway, key, "/v1/chat/completions", CHAT)


async def _gateway_fails(gateway: Gateway, key: str) -> None:
    """The gateway's own failure after the provider answered: a 500, still billed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "answer_output_chars", _broken)
        await _post(gateway, key, "/v1/chat/completions", CHAT)


def _broken(*args: Any) -> Any:
    raise RuntimeError("a bug")


@attrs.frozen
class End:
    send: Callable[[Gateway, str], Awaitable[None]]
    span: str
    status: int
    error_type: str | None


ENDS = {
    "json answered": End(_request("/v1/chat/completions", CHAT), "chat qwen3-5-9b", 200, None),
    "json refused by the provider": End(
        _request("/v1/chat/completions", CHAT, Behaviour(status=400)),
        "chat qwen3-5-9b",
        400,
        "400",
    ),
    "stream answered": End(
        _request("/v1/chat/completions", {**CHAT, "stream": True}),
        "chat qwen3-5-9b",
        200,
        None,
    ),
    "stream refused by the provider": End(
        _request("/v1/chat/completions", {**CHAT, "stream": True}, Behaviour(status=400)),
        "chat qwen3-5-9b",
        400,
        "400",
    ),
    "stream cut by the provider and continued": End(
        _request("/v1/chat/completions", {**CHAT, "stream": True}, Behaviour(drop_after_chunks=1)),
        "chat qwen3-5-9b",
        200,
        None,
    ),
    "stream cut by the gateway (an event too large)": End(
        _request(
            "/v1/chat/completions",
            {**CHAT, "stream": True},
            Behaviour(oversized_event_bytes=64 * 1024 * 1024),
        ),
        "chat qwen3-5-9b",
        200,
        "upstream_event_too_large",
    ),
    "stream the caller left": End(_caller_leaves, "chat qwen3-5-9b", 499, "cancelled"),
    "messages answered": End(_request("/v1/messages", MESSAGES), "chat qwen3-5-9b", 200, None),
    "messages stream answered": End(
        _request("/v1/messages", {**MESSAGES, "stream": True}),
        "chat qwen3-5-9b",
        200,
        None,
    ),
    "messages counted (the gateway's estimate)": End(
        _request(
            "/v1/messages/count_tokens", {"model": "qwen3-5-9b", "messages": MESSAGES["messages"]}
        ),
        "count_tokens qwen3-5-9b",
        200,
        None,
    ),
    "responses answered (and stored)": End(
        _request("/v1/responses", {"model": "qwen3-5-9b", "input": "hi"}),
        "chat qwen3-5-9b",
        200,
        None,
    ),
    "responses stream answered (and stored)": End(
        _request("/v1/responses", {"model": "qwen3-5-9b", "input": "hi", "stream": True}),
        "chat qwen3-5-9b",
        200,
        None,
    ),
    "speech answered": End(
        _request("/v1/audio/speech", SPEECH), "text_to_speech tts-kokoro", 200, None
    ),
    "speech refused by the provider": End(
        _request("/v1/audio/speech", SPEECH, Behaviour(status=400)),
        "text_to_speech tts-kokoro",
        400,
        "400",
    ),
    "transcription answered": End(_transcribe, "speech_to_text openai/whisper-large-v3", 200, None),
    "a row whose figures cannot be computed": End(
        _row_cannot_be_computed, "chat qwen3-5-9b", 200, None
    ),
    "an exception inside the gateway": End(
        _gateway_fails, "chat qwen3-5-9b", 500, "internal_error"
    ),
}


@pytest.mark.parametrize("end", list(ENDS.values()), ids=list(ENDS))
async def test_every_end_settles_once_writes_one_row_one_span_and_one_billing_line(
    gateway: Gateway,
    api_key: str,
    end: End,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await assert_one_end(gateway, api_key, end, monkeypatch, caplog)


TIMEOUTS = {
    "json timed out waiting for the provider": End(
        _request("/v1/chat/completions", CHAT, Behaviour(delay_before_headers=3.0)),
        "chat qwen3-5-9b",
        504,
        "upstream_timeout",
    ),
    "stream timed out idle, and its continuation too": End(
        _request(
            "/v1/chat/completions",
            {**CHAT, "stream": True},
            Behaviour(stall_after_chunks=2),
            Behaviour(stall_after_chunks=1),
        ),
        "chat qwen3-5-9b",
        200,
        "upstream_stream_timeout",
    ),
}


@pytest.mark.parametrize("end", list(TIMEOUTS.values()), ids=list(TIMEOUTS))
async def test_a_timeout_ends_the_request_once(
    start_gateway: Any,
    api_key_for: Any,
    end: End,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = await start_gateway(request_timeout_seconds=1.0, upstream_max_retries=0)
    await assert_one_end(gateway, await api_key_for(gateway), end, monkeypatch, caplog)


async def _stream_open_at_shutdown(gateway: Gateway, key: str) -> None:
    """A stream the provider stalls after its first chunk, open when the server shuts down: it
    ends at the grace with an error event while its caller still reads."""
    gateway.fake.enqueue(Behaviour(stall_after_chunks=1))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={**CHAT, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        await response.content.readline()
        closing = asyncio.create_task(gateway.server.close())
        rest = await response.read()
        await closing
    assert b'"code":"gateway_shutting_down"' in rest


async def _json_in_flight_past_the_grace(gateway: Gateway, key: str) -> None:
    """A JSON request whose provider has not answered when the grace is over: the server cancels
    it and closes its connection."""
    gateway.fake.enqueue(Behaviour(delay_before_headers=10.0))
    sent = asyncio.create_task(_post(gateway, key, "/v1/chat/completions", CHAT))
    await eventually(lambda: len(gateway.fake.chats()) == 1)
    await gateway.server.close()
    with contextlib.suppress(aiohttp.ClientError):
        await sent


SHUTDOWNS = {
    "stream open when the server shuts down": End(
        _stream_open_at_shutdown, "chat qwen3-5-9b", 200, "gateway_shutting_down"
    ),
    "json in flight past the shutdown grace": End(
        _json_in_flight_past_the_grace, "chat qwen3-5-9b", 499, "cancelled"
    ),
}


@pytest.mark.parametrize("end", list(SHUTDOWNS.values()), ids=list(SHUTDOWNS))
async def test_a_request_in_flight_at_shutdown_ends_once(
    start_gateway: Any,
    api_key_for: Any,
    end: End,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server's cleanup (as SIGTERM starts it) with a request still running: the request's
    one end comes before the ledger and the telemetry close."""
    gateway = await start_gateway(shutdown_grace_seconds=1.0)
    await assert_one_end(gateway, await api_key_for(gateway), end, monkeypatch, caplog)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_cache_hit_ends_the_request_once(
    start_gateway: Any,
    api_key_for: Any,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = await start_gateway(cache="memory")
    key = await api_key_for(gateway)
    send = _request("/v1/chat/completions", {**CHAT, "stream": stream})
    await send(gateway, key)  # a miss: the provider answers, and the answer is stored
    await flush(gateway)
    end = End(send, "chat qwen3-5-9b", 200, None)
    await assert_one_end(gateway, key, end, monkeypatch, caplog, rows="WHERE cache_hit")
    assert len(gateway.fake.received) == 1  # the hit did not call the provider


async def assert_one_end(
    gateway: Gateway,
    api_key: str,
    end: End,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    *,
    rows: str = "",
) -> None:
    """One settlement, one ledger row, one span, one billing line, in that order."""
    settlements: list[Any] = []
    steps: list[str] = []
    settle, queue = Ticket.settle, UsageLedger.record
    finish, abandon = ChatObservation.finish, ChatObservation.abandon

    def settled(self: Ticket, record: Any, *args: Any) -> None:
        settlements.append(record)
        steps.append("settle")
        settle(self, record, *args)

    def queued(self: UsageLedger, *args: Any) -> None:
        steps.append("ledger")
        queue(self, *args)

    def finished(self: ChatObservation, **kwargs: Any) -> None:
        steps.append("span")
        finish(self, **kwargs)

    monkeypatch.setattr(Ticket, "settle", settled)
    monkeypatch.setattr(UsageLedger, "record", queued)

    def abandoned(self: ChatObservation) -> None:
        steps.append("span")
        abandon(self)

    monkeypatch.setattr(ChatObservation, "finish", finished)
    monkeypatch.setattr(ChatObservation, "abandon", abandoned)
    log = UsageAccounting.log

    def logged(self: UsageAccounting, fields: dict[str, Any]) -> None:
        steps.append("log")
        log(self, fields)

    monkeypatch.setattr(UsageAccounting, "log", logged)
    caplog.set_level(logging.INFO, logger="llmgw.billing")
    caplog.clear()  # a cache hit's test made one request before

    await end.send(gateway, api_key)

    def billing_lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == BILLING_EVENT]

    await eventually(lambda: len(billing_lines()) >= 1)
    await flush(gateway)
    ended = await gateway.db.fetch(f"SELECT status, error_type FROM usage_events {rows}")
    assert [(row["status"], row["error_type"]) for row in ended] == [(end.status, end.error_type)]
    assert len(settlements) == 1
    assert settlements[0] is not None  # settled with the request's record
    spans = [s for s in gateway.telemetry.finished_spans() if s.name == end.span]
    assert len(spans) == 1 + (rows != "")  # a cache hit's test made one request before
    assert len(billing_lines()) == 1
    assert steps == ["settle", "ledger", "span", "log"]
