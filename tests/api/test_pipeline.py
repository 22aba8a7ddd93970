"""The pipeline's failure path is total: once a provider answered, the request has its one usage
row whatever fails inside the gateway, the caller gets an error in its API's shape, and a stream
whose headers went out gets nothing but an error event (never a second HTTP response in its body).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from llmgw.api import pipeline
from llmgw.translation.anthropic_stream import MessageStream
from tests.conftest import Gateway
from tests.fake_venice import FAKE_VENICE_KEY
from tests.test_policy_and_ledger import flush

HI = [{"role": "user", "content": "hi"}]
ADD_TOOL = {"name": "add", "input_schema": {"type": "object"}}


async def post(gateway: Gateway, key: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """The status and the whole body; raises if the body is not well-formed HTTP."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url(path), json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        return response.status, await response.read()


async def ledger_rows(gateway: Gateway) -> list[Any]:
    await flush(gateway)
    return await gateway.db.fetch(
        "SELECT status, error_type, input_tokens, output_tokens, flags FROM usage_events"
    )


def _failing_charge(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("the record builder broke")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_record_that_cannot_be_computed_is_still_written_and_the_answer_delivered(
    gateway: Gateway, api_key: str, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    monkeypatch.setattr(pipeline, "charge", _failing_charge)
    status, body = await post(
        gateway,
        api_key,
        "/v1/chat/completions",
        {"model": "qwen3-5-9b", "messages": HI, "stream": stream},
    )
    assert status == 200
    assert b"HTTP/1.1" not in body
    if stream:
        assert body.endswith(b"data: [DONE]\n\n")
    else:
        assert orjson.loads(body)["choices"][0]["message"]["content"] == gateway.fake.reply
    (row,) = await ledger_rows(gateway)
    # The provider's reported usage as it came (no estimate, no price), flagged for the operator.
    assert (row["status"], row["input_tokens"], row["output_tokens"]) == (200, 1, 5)
    assert row["flags"] == [pipeline.RECORD_NOT_COMPUTED]
    span = gateway.telemetry.span("chat qwen3-5-9b")
    assert span.attributes["error.type"] == "internal_error"
    assert FAKE_VENICE_KEY not in str(span.attributes) and api_key not in str(span.attributes)


async def test_an_answer_nested_too_deeply_to_translate_is_a_502_in_anthropics_shape_and_billed(
    gateway: Gateway, api_key: str
) -> None:
    # Tool arguments orjson reads (300 levels) but cannot write back (254) as a tool_use input.
    gateway.fake.tool_call = ("add", '{"a":' * 300 + "1" + "}" * 300)
    status, body = await post(
        gateway,
        api_key,
        "/v1/messages",
        {"model": "qwen3-5-9b", "max_tokens": 16, "messages": HI, "tools": [ADD_TOOL]},
    )
    assert status == 502
    answer = orjson.loads(body)
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "api_error"
    assert "nested too deeply" in answer["error"]["message"]
    (row,) = await ledger_rows(gateway)
    assert (row["status"], row["error_type"]) == (502, "upstream_invalid_response")
    assert (row["input_tokens"], row["output_tokens"]) == (1, 5)  # the provider worked: billed


async def test_a_stream_failing_inside_the_gateway_ends_with_one_error_event(
    gateway: Gateway, api_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed = MessageStream.feed
    fed: list[int] = []

    def failing_feed(self: MessageStream, chunk: dict[str, Any]) -> bytes:
        fed.append(1)
        if len(fed) == 3:
            raise RuntimeError("the translator broke")
        return feed(self, chunk)

    monkeypatch.setattr(MessageStream, "feed", failing_feed)
    status, body = await post(
        gateway,
        api_key,
        "/v1/messages",
        {"model": "qwen3-5-9b", "max_tokens": 16, "messages": HI, "stream": True},
    )
    assert status == 200
    assert b"HTTP/1.1" not in body
    events = [event for event in body.split(b"\n\n") if event]
    assert events[0].startswith(b"event: message_start")
    assert events[-1].startswith(b"event: error\n")
    error = orjson.loads(events[-1].partition(b"data: ")[2])
    assert error["error"]["type"] == "api_error"
    assert sum(event.startswith(b"event: error") for event in events) == 1
    (row,) = await ledger_rows(gateway)
    assert (row["status"], row["error_type"]) == (200, "internal_error")
