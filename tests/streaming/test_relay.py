"""The relay on a real socket: byte-for-byte forwarding, and the StreamTranslator hook."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.accounting.usage import CostReport, Usage, parse_usage
from llmgw.errors import GatewayError
from llmgw.streaming.relay import USAGE_DRAIN_SECONDS
from llmgw.streaming.summary import StreamSummary
from tests.recorded import recorded_streams
from tests.streaming.relaying import DONE, ScriptedStream, chunk, parse_sse, payloads, relay


class FakeTranslator:
    """Names what it was given, so the test can see each hook was called in order."""

    def start(self) -> bytes:
        return b"event: start\n\n"

    def feed(self, chunk: dict[str, Any]) -> bytes:
        return b"event: chunk\ndata: " + orjson.dumps(chunk.get("choices")) + b"\n\n"

    async def finish(self) -> bytes:
        return b"event: finish\n\n"

    def error(self, error: GatewayError) -> bytes:
        return b"event: error\ndata: " + error.error_kind.encode() + b"\n\n"


FIRST = chunk([{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}])
FINISH = chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
USAGE = chunk([], usage={"prompt_tokens": 3, "completion_tokens": 1})


async def test_without_a_translator_events_are_forwarded_byte_for_byte() -> None:
    reads = [FIRST[:7], FIRST[7:] + FINISH, USAGE + DONE]
    body, summaries = await relay(ScriptedStream(reads))
    assert body == FIRST + FINISH + USAGE + DONE
    assert summaries == [
        StreamSummary(
            outcome="completed",
            status=200,
            error_type=None,
            usage=Usage(input_tokens=3, output_tokens=1),
            output_chars=2,
            response_id="c",
        )
    ]


async def test_a_translator_gets_start_every_chunk_and_finish_instead_of_done() -> None:
    stream = ScriptedStream([FIRST, FINISH[:5], FINISH[5:], USAGE, DONE])
    body, summaries = await relay(stream, translator=FakeTranslator())
    assert body == (
        b"event: start\n\n"
        b'event: chunk\ndata: [{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]\n\n'
        b'event: chunk\ndata: [{"index":0,"delta":{},"finish_reason":"stop"}]\n\n'
        b"event: chunk\ndata: []\n\n"
        b"event: finish\n\n"
    )
    assert stream.closed
    (summary,) = summaries
    assert summary.outcome == "completed"
    assert summary.usage == Usage(input_tokens=3, output_tokens=1)


async def test_a_translator_renders_a_failure_after_start_as_its_own_error_event() -> None:
    body, summaries = await relay(ScriptedStream([FIRST]), translator=FakeTranslator())
    assert body.startswith(b"event: start\n\nevent: chunk\n")
    assert body.endswith(b"event: error\ndata: upstream_stream_incomplete\n\n")
    assert b"[DONE]" not in body and b"event: finish" not in body
    assert [(s.outcome, s.error_type) for s in summaries] == [
        ("failed", "upstream_stream_incomplete")
    ]


TEXT = "Hi"
FINISH_WITH_USAGE = chunk(
    [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}],
    usage={"prompt_tokens": 3, "completion_tokens": 1},
)
USAGE_ON_EMPTY_DELTA = chunk(
    [{"index": 0, "delta": {"content": "", "role": None}, "finish_reason": None}],
    usage={"prompt_tokens": 3, "completion_tokens": 1},
)
REPORTED = Usage(input_tokens=3, output_tokens=1)


async def test_done_ends_the_stream_at_once_and_the_rest_is_never_read() -> None:
    stream = ScriptedStream([FIRST + FINISH + USAGE + DONE + b"data: never read\n\n", b"junk"])
    body, summaries = await relay(stream)
    assert body == FIRST + FINISH + USAGE + DONE
    assert stream.closed
    assert [(s.outcome, s.usage) for s in summaries] == [("completed", REPORTED)]


async def test_a_clean_close_after_the_finish_chunk_is_completed_and_the_gateway_sends_done() -> (
    None
):
    body, summaries = await relay(ScriptedStream([FIRST, FINISH_WITH_USAGE]))
    assert body == FIRST + FINISH_WITH_USAGE + DONE
    assert [(s.outcome, s.error_type, s.usage) for s in summaries] == [
        ("completed", None, REPORTED)
    ]


async def test_a_close_before_the_finish_chunk_ends_with_an_error_event_and_fails() -> None:
    body, summaries = await relay(ScriptedStream([FIRST]))
    assert payloads(body)[-1]["error"]["code"] == "upstream_stream_incomplete"
    assert [(s.outcome, s.status, s.output_chars) for s in summaries] == [("failed", 200, 2)]


async def test_the_usage_chunk_asked_for_on_the_callers_behalf_is_hidden_when_it_is_all_usage() -> (
    None
):
    reads = [FIRST, FINISH, USAGE_ON_EMPTY_DELTA, USAGE, DONE]
    body, summaries = await relay(ScriptedStream(reads), hide_usage_chunk=True)
    assert body == FIRST + FINISH + DONE
    assert summaries[0].usage == REPORTED


async def test_usage_on_the_finish_chunk_is_kept_for_the_caller() -> None:
    body, summaries = await relay(
        ScriptedStream([FIRST, FINISH_WITH_USAGE, DONE]), hide_usage_chunk=True
    )
    assert body == FIRST + FINISH_WITH_USAGE + DONE
    assert summaries[0].usage == REPORTED


async def test_an_upstream_error_event_is_forwarded_and_the_stream_fails() -> None:
    error = b'data: {"error": {"message": "overloaded", "code": "model_overloaded"}}\n\n'
    stream = ScriptedStream([FIRST, error, DONE])
    body, summaries = await relay(stream)
    # The provider's own event, and the stream closes: a [DONE] would make it look complete.
    assert body == FIRST + error
    assert stream.closed
    assert [(s.outcome, s.error_type) for s in summaries] == [("failed", "upstream_stream_error")]


async def test_an_event_over_the_size_limit_ends_the_stream_with_an_error_event() -> None:
    never_ends = [b"data: " + b"x" * 4096 for _ in range(4)]
    stream = ScriptedStream([FIRST, *never_ends])
    body, summaries = await relay(stream, max_event_bytes=8192)
    assert body.startswith(FIRST)
    assert b"xxxx" not in body
    assert payloads(body)[-1]["error"]["code"] == "upstream_event_too_large"
    assert [(s.outcome, s.error_type) for s in summaries] == [
        ("failed", "upstream_event_too_large")
    ]
    assert stream.closed


async def test_a_stream_longer_than_its_maximum_duration_ends_with_an_error_event() -> None:
    stream = ScriptedStream([FIRST], stall=True)
    started = asyncio.get_running_loop().time()
    body, summaries = await relay(stream, max_seconds=0.3)
    assert asyncio.get_running_loop().time() - started < 3
    assert payloads(body)[-1]["error"]["code"] == "stream_max_duration"
    assert [(s.outcome, s.error_type) for s in summaries] == [("failed", "stream_max_duration")]


async def test_a_caller_leaving_mid_stream_is_cancelled_499_with_what_was_produced() -> None:
    stream = ScriptedStream([FIRST], stall=True)
    _, summaries = await relay(stream, hang_up_after=FIRST)
    assert summaries == [
        StreamSummary(
            outcome="cancelled",
            status=499,
            error_type="cancelled",
            usage=None,
            output_chars=2,
            response_id="c",
        )
    ]
    assert stream.closed


async def test_a_caller_leaving_after_the_finish_chunk_is_completed_with_the_usage_read_after() -> (
    None
):
    stream = ScriptedStream([FIRST, FINISH, 0.3, USAGE, DONE])
    body, summaries = await relay(stream, hang_up_after=FINISH)
    assert USAGE not in body
    assert [(s.outcome, s.status, s.usage) for s in summaries] == [("completed", 200, REPORTED)]
    assert stream.closed


async def test_a_usage_that_never_comes_after_the_caller_left_ends_the_drain_in_time() -> None:
    stream = ScriptedStream([FIRST, FINISH], stall=True)
    started = asyncio.get_running_loop().time()
    _, summaries = await relay(stream, hang_up_after=FINISH)
    assert asyncio.get_running_loop().time() - started < USAGE_DRAIN_SECONDS + 3
    assert [(s.outcome, s.usage, s.output_chars) for s in summaries] == [("completed", None, 2)]


@pytest.mark.parametrize("hide_usage_chunk", [False, True], ids=["usage asked", "usage hidden"])
async def test_a_json_completion_answering_a_stream_is_sent_as_a_stream(
    hide_usage_chunk: bool,
) -> None:
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "cost": {"usd": 0.25, "diem": 0},
    }
    raw = orjson.dumps(completion)
    stream = ScriptedStream([raw[:10], raw[10:]], content_type="application/json; charset=utf-8")
    body, summaries = await relay(stream, hide_usage_chunk=hide_usage_chunk)
    events = payloads(body)
    assert events[-1] == "[DONE]"
    (choice,) = events[0]["choices"]
    assert choice["delta"]["content"] == "Hello"
    assert choice["delta"]["tool_calls"][0]["index"] == 0
    assert choice["delta"]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert choice["finish_reason"] == "tool_calls"
    assert events[0]["object"] == "chat.completion.chunk"
    assert len(events) == (2 if hide_usage_chunk else 3)
    if not hide_usage_chunk:
        assert events[1]["choices"] == [] and events[1]["usage"]["prompt_tokens"] == 3
    (summary,) = summaries
    assert summary.outcome == "completed"
    assert summary.usage == Usage(
        input_tokens=3,
        output_tokens=1,
        cost_usd=0.25,
        extras={"venice.cost.usd": 0.25, "venice.cost.diem": 0.0},
    )
    assert summary.output_chars == len("Hello") + len("{}")


# ---------------------------------------------------------------------------------------------
# Any valid framing of the same stream: the caller gets the same events, the same usage is kept.


def generated_stream(usage_on_finish: bool, tool: bool) -> bytes:
    """A Venice-shaped stream: qwen's separate usage chunk, or mistral's usage on the finish chunk."""
    head = {"id": "chatcmpl-g", "created": 0, "model": "m", "object": "chat.completion.chunk"}
    extra: dict[str, Any] = {"usage": None} if usage_on_finish else {}

    def event(choices: list[dict[str, Any]], **fields: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra, **fields}) + b"\n\n"

    def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
        return {"index": 0, "delta": fields, "finish_reason": finish, "logprobs": None}

    events = [event([delta(role="assistant", content="")])]
    events += [event([delta(content="", reasoning_content=piece)]) for piece in ("Th", "ink ✓")]
    if tool:
        call = {"index": 0, "id": "call_1", "type": "function"}
        events.append(event([delta(tool_calls=[{**call, "function": {"name": "add"}}])]))
        events += [
            event([delta(tool_calls=[{"index": 0, "function": {"arguments": piece}}])])
            for piece in ('{"a": ', "4}")
        ]
    else:
        events += [event([delta(content=piece)]) for piece in ("Héllo", " wörld", "\n\n", "!")]
    billing = {
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        "cost": {"usd": 0.00010471875, "diem": 0},
    }
    finish = delta("tool_calls" if tool else "stop", content="")
    if usage_on_finish:
        events.append(event([finish], **billing))
    else:
        events += [event([finish]), event([], **billing)]
    return b"".join(events) + DONE


GENERATED = {
    f"generated-{placement}-{kind}": generated_stream(placement == "finish", kind == "tools")
    for placement in ("separate", "finish")
    for kind in ("text", "tools")
}
LINE_ENDINGS = (b"\n", b"\r\n", b"\r")


@st.composite
def framings(draw: st.DrawFn, source: bytes) -> tuple[list[bytes], list[bytes]]:
    """The source's events in a random valid framing: (events as sent, the reads they arrive in)."""
    style = draw(st.sampled_from(["compact", "spaced", "multi-line"]))
    # Per-event choices from one seeded generator: hundreds of events stay one cheap draw.
    rng = draw(st.randoms(use_true_random=False))
    events = []
    for data in parse_sse(source):
        if style != "compact" and data != b"[DONE]":
            document = orjson.loads(data)
            data = json.dumps(document, indent=1 if style == "multi-line" else None).encode()
        ending = rng.choice(LINE_ENDINGS)
        prefix = rng.choice([b"data: ", b"data:"])
        comment = rng.choice([b"", b": keep-alive" + ending])
        lines = b"".join(prefix + line + ending for line in data.split(b"\n"))
        events.append(comment + lines + ending)
    sent = b"".join(events)
    cuts = set(draw(st.lists(st.integers(1, len(sent) - 1), max_size=24)))
    # A CRLF cut in two, and the last byte alone, happen in every example.
    crlf = sent.find(b"\r\n")
    cuts |= {len(sent) - 1, *([crlf + 1] if crlf > 0 else [])}
    bounds = [0, *sorted(cuts), len(sent)]
    return events, [sent[start:end] for start, end in itertools.pairwise(bounds)]


def _caller_sees(event: bytes, hide_usage_chunk: bool) -> bool:
    (data,) = parse_sse(event)
    if not hide_usage_chunk or data == b"[DONE]":
        return True
    document = orjson.loads(data)
    if not document.get("usage"):
        return True
    return any(
        choice.get("finish_reason")
        or any(value not in (None, "", False) for value in choice["delta"].values())
        for choice in document["choices"]
    )


def _reported_usage(source: bytes) -> Usage:
    (usage,) = [
        parse_usage(document, cost=CostReport("venice.cost"))
        for data in parse_sse(source)
        if data != b"[DONE]" and (document := orjson.loads(data)).get("usage")
    ]
    assert usage is not None
    return usage


SOURCES = ["recorded", *GENERATED]


@pytest.mark.parametrize("source_name", SOURCES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hide_usage_chunk=st.booleans())
def test_every_framing_and_split_gives_the_caller_the_same_events_and_the_same_usage(
    source_name: str, data: st.DataObject, hide_usage_chunk: bool
) -> None:
    if source_name == "recorded":
        recorded = recorded_streams()
        if not recorded:
            pytest.skip("recorded Venice traffic not available")
        source = recorded[data.draw(st.sampled_from(sorted(recorded)), label="recording")]
    else:
        source = GENERATED[source_name]
    events, reads = data.draw(framings(source), label="framing")
    body, summaries = asyncio.run(relay(ScriptedStream(reads), hide_usage_chunk=hide_usage_chunk))
    assert body == b"".join(e for e in events if _caller_sees(e, hide_usage_chunk))
    (summary,) = summaries
    assert (summary.outcome, summary.error_type) == ("completed", None)
    assert summary.usage == _reported_usage(source)
