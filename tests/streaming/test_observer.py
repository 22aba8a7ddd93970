"""The stream observer: what each event carried, and which ones the caller sees."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.accounting.usage import Usage
from llmgw.streaming.observer import StreamObserver
from tests.streaming.relaying import observation

USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
REPORTED = Usage(
    input_tokens=5,
    output_tokens=2,
    cost_usd=0.5,
    extras={"venice.cost.usd": 0.5, "venice.cost.diem": 0.0},
)


def event(document: dict[str, Any], *, spaced: bool = False) -> bytes:
    return (
        b"data: "
        + json.dumps(document, separators=None if spaced else (",", ":")).encode()
        + b"\n\n"
    )


def choice(finish: str | None = None, **delta: Any) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": finish}


def observer(*, hide: bool = True) -> StreamObserver:
    return StreamObserver(observation(), hide_usage_chunk=hide)


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
@pytest.mark.parametrize(
    "choices", [[], [choice(content="", role=None, reasoning_content=None)]], ids=["empty", "blank"]
)
def test_the_usage_chunk_is_read_and_hidden_when_it_carries_nothing_else(
    spaced: bool, choices: list[dict[str, Any]]
) -> None:
    seen = observer()
    usage_chunk = {"choices": choices, "usage": USAGE, "cost": {"usd": 0.5, "diem": 0}}
    assert seen.observe(event(usage_chunk, spaced=spaced)) is False
    assert seen.usage == REPORTED


def test_usage_on_the_finish_chunk_is_read_and_the_chunk_is_kept() -> None:
    seen = observer()
    finish = {
        "choices": [choice("stop", content="")],
        "usage": USAGE,
        "cost": {"usd": 0.5, "diem": 0},
    }
    assert seen.observe(event(finish, spaced=True)) is True
    assert (seen.usage, seen.finished) == (REPORTED, True)


def test_a_caller_who_asked_for_usage_sees_the_usage_chunk() -> None:
    seen = observer(hide=False)
    assert seen.observe(event({"choices": [], "usage": USAGE})) is True
    assert seen.usage is not None


def test_null_usage_and_null_finish_reasons_on_every_chunk_are_nothing() -> None:
    seen = observer()
    assert seen.observe(event({"choices": [choice(content="Hi")], "usage": None})) is True
    assert (seen.usage, seen.finished) == (None, False)


def test_output_characters_count_content_reasoning_and_tool_arguments() -> None:
    seen = observer()
    call = {"index": 0, "function": {"name": "add", "arguments": '{"a": 1}'}}
    for chunk in (
        {"choices": [choice(content="héllo", reasoning_content="ab")]},
        {"choices": [choice(tool_calls=[call])]},
        {"choices": [choice(reasoning="xyz", content=None)]},
    ):
        assert seen.observe(event(chunk)) is True
    assert seen.output_chars == len("héllo") + 2 + len('{"a": 1}') + 3


@pytest.mark.parametrize(
    "done", [b"data: [DONE]\n\n", b"data:[DONE]\r\n\r\n", b": bye\rdata: [DONE]\r\r"]
)
def test_done_in_any_framing(done: bytes) -> None:
    seen = observer()
    assert seen.observe(done) is True
    assert seen.done


def test_comments_and_blank_events_pass_untouched() -> None:
    seen = observer()
    assert seen.observe(b": keep-alive\n\n") is True
    assert seen.observe(b"\n") is True
    assert not seen.done
    assert seen.malformed == 0


def test_an_error_event_is_passed_on_and_noted() -> None:
    seen = observer()
    assert seen.observe(event({"error": {"message": "overloaded"}}, spaced=True)) is True
    assert seen.upstream_error


@pytest.mark.parametrize("data", [b"data: {not json\n\n", b"data: [1, 2]\n\n"])
def test_data_that_is_not_a_json_object_is_dropped_and_counted_and_the_stream_goes_on(
    data: bytes,
) -> None:
    seen = observer()
    assert seen.observe(data) is False
    assert seen.observe(data) is False
    assert seen.malformed == 2
    assert seen.observe(event({"choices": [choice(content="late")]})) is True
    assert seen.output_chars == len("late")


def messages_event(kind: str, **fields: Any) -> bytes:
    """A Messages stream event as Anthropic frames it: its name, then its data."""
    return f"event: {kind}\n".encode() + event({"type": kind, **fields})


def test_a_messages_stream_is_read_for_its_ids_usage_text_and_ending() -> None:
    seen = observer()
    start_usage = {
        "input_tokens": 20,
        "output_tokens": 1,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 1200,
    }
    message = {"id": "msg_1", "model": "claude-sonnet-4-5", "content": [], "usage": start_usage}
    events = [
        messages_event("message_start", message=message),
        messages_event(
            "content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Hm"}
        ),
        messages_event(
            "content_block_delta", index=0, delta={"type": "signature_delta", "signature": "EqQB"}
        ),
        messages_event(
            "content_block_delta", index=1, delta={"type": "text_delta", "text": "Hello"}
        ),
        messages_event(
            "content_block_delta",
            index=2,
            delta={"type": "input_json_delta", "partial_json": '{"a":1}'},
        ),
        messages_event("ping"),
    ]
    assert all(seen.observe(e) for e in events), "every event reaches the caller"
    assert seen.usage == Usage(
        input_tokens=1520,
        output_tokens=1,
        cache_read_input_tokens=1200,
        cache_creation_input_tokens=300,
    )
    assert (seen.output_chars, seen.finished, seen.done) == (2 + 5 + 7, False, False)
    # message_delta's counts are cumulative: they replace the earlier ones, never add to them.
    delta = {"stop_reason": "end_turn", "stop_sequence": None}
    assert seen.observe(messages_event("message_delta", delta=delta, usage={"output_tokens": 40}))
    assert seen.usage is not None and (seen.usage.input_tokens, seen.usage.output_tokens) == (
        1520,
        40,
    )
    assert (seen.finished, seen.done) == (True, False)
    assert seen.observe(messages_event("message_stop"))
    assert seen.done
    assert seen.observation.response_id == "msg_1"
    assert seen.observation.finish_reasons == ["end_turn"]


def test_a_messages_error_event_is_the_providers_error() -> None:
    seen = observer()
    error = {"type": "overloaded_error", "message": "Overloaded"}
    assert seen.observe(messages_event("error", error=error))
    assert seen.upstream_error and not seen.finished
