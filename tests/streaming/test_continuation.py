"""Continuing a broken stream: what the caller has (Transcript), the new stream as its rest
(Splice), and the relay putting the two together."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.accounting.usage import Usage
from llmgw.errors import UpstreamUnavailable
from llmgw.streaming.continuation import (
    Continuation,
    ContinuationMismatch,
    Resumed,
    Splice,
    Transcript,
)
from tests.streaming.relaying import DONE, ScriptedStream, chunk, payloads, relay


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def contents(documents: list[dict[str, Any] | None]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for document in documents
        if document is not None
        for choice in document["choices"]
    )


def test_the_transcript_holds_the_text_sent_and_says_when_it_cannot_be_continued() -> None:
    transcript = Transcript()
    transcript.note(delta(role="assistant", content=""))
    transcript.note(delta(reasoning_content="thinking"))
    assert transcript.why_not() == "inside a reasoning block"
    transcript.note(delta(content="Hello, "))
    transcript.note(delta(content="world"))
    assert (transcript.text, transcript.why_not()) == ("Hello, world", None)
    transcript.note(delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]))
    assert transcript.why_not() == "inside a tool call"


def test_a_prefilled_continuation_is_relayed_without_a_second_role_or_reasoning() -> None:
    splice = Splice("Hello, ", prefilled=True)
    assert splice.chunk(delta(role="assistant", content="")) is None
    assert splice.chunk(delta(reasoning_content="hm")) is None
    assert splice.chunk(delta(content="world")) == delta(content="world")
    assert splice.chunk(delta("stop", content="")) == delta("stop", content="")
    usage = {"choices": [], "usage": {"prompt_tokens": 1}}
    assert splice.chunk(usage) == usage


def test_a_continuation_does_not_repeat_azures_opening_chunk() -> None:
    # Azure's streams open with the prompt's filter verdicts in a chunk without choices.
    verdicts = [{"prompt_index": 0, "content_filter_results": {}}]
    opening = {"choices": [], "id": "", "model": "", "prompt_filter_results": verdicts}
    splice = Splice("Hello, ", prefilled=True)
    assert splice.chunk(opening) is None
    older = {"choices": [], "id": "", "prompt_annotations": verdicts}  # a documented variant
    assert splice.chunk(older) is None
    assert splice.chunk(delta(content="world")) == delta(content="world")


def test_a_restart_is_relayed_from_where_the_caller_is_however_its_chunks_fall() -> None:
    splice = Splice("Hello, wor", prefilled=False)
    rest = [splice.chunk(delta(content=part)) for part in ("Hel", "lo, w", "orld", "!")]
    assert contents(rest) == "ld!"
    assert rest[:2] == [None, None]
    assert splice.chunk(delta("stop")) == delta("stop")


@pytest.mark.parametrize(
    "documents",
    [
        [delta(content="Hello, there")],  # it says something else
        [delta(content="Hel"), delta("stop", content="")],  # it ends before it gets there
        [delta(tool_calls=[{"index": 0}])],  # it calls a tool instead
    ],
    ids=["other-text", "shorter", "tool-call"],
)
def test_a_restart_that_does_not_repeat_the_text_sent_is_refused(
    documents: list[dict[str, Any]],
) -> None:
    splice = Splice("Hello, world", prefilled=False)
    with pytest.raises(ContinuationMismatch):
        for document in documents:
            splice.chunk(document)


FIRST = chunk(
    [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}]
)
REST = [
    chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
    chunk([{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]),
    chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
    chunk([], usage={"prompt_tokens": 3, "completion_tokens": 1}),
    DONE,
]


class Resumer:
    """A ``Resume`` that hands out the given stream and remembers the text it was asked for."""

    def __init__(self, stream: ScriptedStream | None, *, prefilled: bool) -> None:
        self.stream = stream
        self.prefilled = prefilled
        self.asked: list[str] = []
        self.budgets: list[int | None] = []

    async def __call__(self, text: str, left: int | None) -> Resumed:
        self.asked.append(text)
        self.budgets.append(left)
        if self.stream is None:
            raise UpstreamUnavailable("no deployment took it")
        return Resumed(self.stream, "b:m", prefilled=self.prefilled)


@pytest.mark.parametrize(
    "broken",
    [
        ScriptedStream(
            [FIRST], error=UpstreamUnavailable("cut", code="upstream_stream_interrupted")
        ),
        ScriptedStream([FIRST]),  # closed without a finish
        ScriptedStream([FIRST, DONE]),  # [DONE] without a finish: no end
        ScriptedStream([FIRST, b'data: {"error": {"message": "overloaded"}}\n\n', DONE]),
    ],
    ids=["cut", "closed", "done-unfinished", "error-event"],
)
async def test_the_relay_finishes_a_broken_stream_with_one_end(broken: ScriptedStream) -> None:
    resume = Resumer(ScriptedStream(REST), prefilled=True)
    continuation = Continuation(resume=resume, deployment="a:m", left=1)
    body, summaries = await relay(broken, continuation=continuation)
    assert resume.asked == ["Hel"]
    assert broken.closed
    events = [event for event in payloads(body) if event != "[DONE]"]
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == "Hello"
    assert [c["delta"].get("role") for e in events for c in e["choices"]].count("assistant") == 1
    assert body.endswith(REST[-2] + DONE) and body.count(DONE) == 1
    [summary] = summaries
    assert (summary.outcome, summary.usage) == ("completed", Usage(input_tokens=3, output_tokens=1))
    assert [(a.deployment, a.usage, a.output_chars) for a in summary.earlier] == [("a:m", None, 3)]
    assert summary.earlier[0].error in (
        "upstream_stream_interrupted",
        "upstream_stream_incomplete",
        "upstream_stream_error",
    )


async def test_when_no_deployment_takes_the_rest_the_caller_gets_the_failure_that_broke_it() -> (
    None
):
    broken = ScriptedStream(
        [FIRST], error=UpstreamUnavailable("cut", code="upstream_stream_interrupted")
    )
    continuation = Continuation(resume=Resumer(None, prefilled=False), deployment="a:m", left=1)
    body, summaries = await relay(broken, continuation=continuation)
    assert payloads(body)[-1]["error"]["code"] == "upstream_stream_interrupted"
    assert DONE not in body
    assert [(s.outcome, s.error_type, s.earlier) for s in summaries] == [
        ("failed", "upstream_stream_interrupted", ())
    ]


async def test_malformed_events_are_dropped_and_the_stream_goes_on_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    garbage = b"data: {not json\n\n"
    finish = chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    body, summaries = await relay(ScriptedStream([FIRST, garbage, finish, garbage, DONE]))
    assert body == FIRST + finish + DONE
    assert [s.outcome for s in summaries] == ["completed"]
    assert caplog.text.count("not JSON") == 1


async def test_a_failure_after_the_finish_is_not_continued() -> None:
    finish = chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
    error = b'data: {"error": {"message": "overloaded"}}\n\n'
    resume = Resumer(ScriptedStream(REST), prefilled=True)
    continuation = Continuation(resume=resume, deployment="a:m", left=1)
    body, summaries = await relay(ScriptedStream([FIRST, finish, error]), continuation=continuation)
    assert resume.asked == []
    assert body == FIRST + finish + error
    assert [s.error_type for s in summaries] == ["upstream_stream_error"]
