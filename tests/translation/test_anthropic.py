"""llmgw.translation.anthropic and anthropic_stream against golden files, plus the stream rules
every case must keep whatever its golden file says.

Each file in data/anthropic/{request,response,stream}/ holds a case's input and its ``expected``
output. ``LLMGW_UPDATE_GOLDEN=1 pytest tests/translation`` rewrites ``expected`` from the code; the
diff is then reviewed like any other change.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import orjson
import pytest

from llmgw.accounting.estimate import estimate_input_tokens
from llmgw.api.messages import AnthropicCodec
from llmgw.errors import GatewayError, InvalidRequest, UpstreamUnavailable
from llmgw.translation import anthropic
from llmgw.translation.anthropic_stream import MessageStream
from tests.translation import golden
from tests.translation.golden import check_golden, load
from tests.translation.wrong_types import crashes


def cases(kind: str) -> list[Path]:
    return golden.cases(f"anthropic/{kind}")


@pytest.mark.parametrize("path", cases("request"), ids=lambda p: p.stem)
def test_request_translation(path: Path) -> None:
    check_golden(path, anthropic.messages_to_chat(load(path)["request"]))


@pytest.mark.parametrize("path", cases("response"), ids=lambda p: p.stem)
def test_response_translation(path: Path) -> None:
    case = load(path)
    message = anthropic.message_from_chat(
        case["completion"],
        request=case["request"],
        message_id="msg_test",
        new_tool_id=lambda: "toolu_made_here",
    )
    check_golden(path, message)


def parse_events(stream: bytes) -> list[list[Any]]:
    """[event name, data] per SSE frame; every frame must name its event (the SDKs need it)."""
    assert stream.endswith(b"\n\n") or not stream
    events = []
    for frame in stream.decode().split("\n\n")[:-1]:
        name_line, data_line = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        events.append([name_line.removeprefix("event: "), json.loads(data_line[6:])])
    return events


def run_stream(case: dict[str, Any]) -> list[list[Any]]:
    request = case["request"]
    translator = MessageStream(
        model=request["model"],
        message_id="msg_test",
        estimated_input_tokens=case["estimated_input_tokens"],
        stop_sequences=request.get("stop_sequences", ()),
        new_tool_id=lambda: "toolu_made_here",
    )
    out = translator.start()
    for chunk in case["chunks"]:
        out += translator.feed(chunk)
    if "error" in case:
        error = GatewayError(case["error"]["message"])
        error.status = case["error"]["status"]
        out += translator.error(error)
    out += asyncio.run(translator.finish())
    out += asyncio.run(translator.finish())  # idempotent: nothing after the end
    return parse_events(out)


@pytest.mark.parametrize("path", cases("stream"), ids=lambda p: p.stem)
def test_stream_translation(path: Path) -> None:
    check_golden(path, run_stream(load(path)))


@pytest.mark.parametrize("path", cases("stream"), ids=lambda p: p.stem)
def test_stream_keeps_anthropics_rules(path: Path) -> None:
    events = run_stream(load(path))
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[0] == "message_start" and names.count("message_start") == 1
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] > 0
    assert names[-1] in ("message_stop", "error")
    if names[-1] == "error":
        assert "message_stop" not in names and "message_delta" not in names
    else:
        assert names[-2] == "message_delta"
        assert events[-2][1]["delta"]["stop_reason"] is not None
        assert "output_tokens" in events[-2][1]["usage"]
    # Blocks: indexes 0, 1, 2, … in start order, one open at a time, deltas only to the open one.
    open_index: int | None = None
    next_index = 0
    for name, data in events:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index, next_index = None, next_index + 1
        elif name in ("message_delta", "message_stop"):
            assert open_index is None


def test_golden_streams_cover_every_event_and_block() -> None:
    seen_events: set[str] = set()
    seen_blocks: set[str] = set()
    seen_deltas: set[str] = set()
    for path in cases("stream"):
        for name, data in run_stream(load(path)):
            seen_events.add(name)
            if name == "content_block_start":
                seen_blocks.add(data["content_block"]["type"])
            if name == "content_block_delta":
                seen_deltas.add(data["delta"]["type"])
    assert seen_events == {
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
    }
    assert seen_blocks == {"text", "thinking", "tool_use"}
    assert seen_deltas == {"text_delta", "thinking_delta", "input_json_delta"}


def test_golden_requests_cover_every_block_type() -> None:
    kinds: set[str] = set()
    for path in cases("request"):
        for message in load(path)["request"]["messages"]:
            if isinstance(message["content"], list):
                kinds.update(block["type"] for block in message["content"])
    assert kinds >= {
        "text",
        "image",
        "document",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}, "model"),
        ({"model": "m", "messages": [], "max_tokens": 1}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
            "max_tokens",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
                "stream": "yes",
            },
            "stream",
        ),
    ],
)
def test_validation_names_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        anthropic.validate_messages_request(body)
    assert caught.value.param == param


def user(*blocks: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": list(blocks)}]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (user({"type": "text"}), "messages[0].content[0].text"),
        (user({"text": "no type"}), "messages[0].content[0]"),
        (user({"type": "image", "source": {"type": "file"}}), "messages[0].content[0].source.type"),
        (
            user(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/tiff", "data": ""},
                }
            ),
            "messages[0].content[0].source.media_type",
        ),
        (user({"type": "tool_result"}), "messages[0].content[0].tool_use_id"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "t"}],
            },
            "tools[0].input_schema",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "t", "input_schema": {}}],
                "tool_choice": {"type": "sometimes"},
            },
            "tool_choice.type",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "system": [{"type": "image"}],
            },
            "system",
        ),
    ],
)
def test_bad_blocks_are_refused_with_the_field_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        anthropic.messages_to_chat(body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),
        (413, "request_too_large"),
        (415, "invalid_request_error"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_types_by_status(status: int, kind: str) -> None:
    assert anthropic.error_body(status, "why") == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


def test_tool_input_is_always_an_object() -> None:
    assert anthropic.tool_input('{"a": 1}') == {"a": 1}
    assert anthropic.tool_input("") == {}
    assert anthropic.tool_input("[1, 2]") == {}
    assert anthropic.tool_input(None) == {}
    assert anthropic.tool_input(orjson.dumps({"b": 2})) == {"b": 2}


# ---------------------------------------------------------------------------------------------
# Wrong JSON types anywhere: a caller's mistake is a 400 naming nothing worse; a provider's odd
# answer is translated (or refused as the provider's fault), never a crash.


def test_a_request_with_a_wrong_type_anywhere_is_refused_or_translated() -> None:
    def translate(body: Any) -> None:
        if isinstance(body, dict):
            anthropic.validate_messages_request(body)
            chat = anthropic.messages_to_chat(body)
            orjson.dumps(chat)
            estimate_input_tokens(chat)
            AnthropicCodec().stream_translator(request=body, estimated_input_tokens=1).start()

    found = [
        f"{case.stem}: {crash}"
        for case in cases("request")
        for crash in crashes(load(case)["request"], translate, (InvalidRequest,))
    ]
    assert not found, "\n".join(found)


def test_an_answer_with_a_wrong_type_anywhere_is_translated_or_refused() -> None:
    found = []
    for path in cases("response"):
        case = load(path)

        def translate(completion: Any, request: dict[str, Any] = case["request"]) -> None:
            if isinstance(completion, dict):
                message = anthropic.message_from_chat(
                    completion, request=request, message_id="msg_test"
                )
                orjson.dumps(message)

        found += [
            f"{path.stem}: {crash}"
            for crash in crashes(case["completion"], translate, (UpstreamUnavailable,))
        ]
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_a_stream_with_a_wrong_type_anywhere_is_translated_or_ends_in_an_error() -> None:
    found = []
    for path in cases("stream"):
        case = load(path)

        def play(chunks: Any, case: dict[str, Any] = case) -> None:
            if isinstance(chunks, list):
                run_stream({**case, "chunks": [c for c in chunks if isinstance(c, dict)]})

        found += [
            f"{path.stem}: {crash}"
            for crash in crashes(case["chunks"], play, (UpstreamUnavailable,))
        ]
    assert not found, "\n".join(found)


def answer(tool_calls: Any = None, usage: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "x"}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    completion: dict[str, Any] = {"choices": [{"message": message, "finish_reason": "stop"}]}
    if usage is not None:
        completion["usage"] = usage
    return completion


NAMELESS_FUNCTIONS = [{"name": ""}, {}, {"name": None}, {"name": ["add"]}]


@pytest.mark.parametrize("function", NAMELESS_FUNCTIONS)
def test_a_tool_call_naming_no_tool_is_the_providers_failure(function: dict[str, Any]) -> None:
    call = {"id": "call_1", "type": "function", "function": {**function, "arguments": "{}"}}
    with pytest.raises(UpstreamUnavailable) as whole:
        anthropic.message_from_chat(answer([call]), request={}, message_id="msg_test")
    assert whole.value.code == "upstream_invalid_response"
    stream = MessageStream(model="m", message_id="msg_test", estimated_input_tokens=7)
    stream.start()
    stream.feed({"choices": [{"delta": {"content": "Let me"}}]})
    with pytest.raises(UpstreamUnavailable):
        stream.feed({"choices": [{"delta": {"tool_calls": [{"index": 0, **call}]}}]})
    events = parse_events(stream.error(whole.value))
    assert events == [["error", {"type": "error", "error": {"type": "api_error", "message": ANY}}]]


BAD_COUNTS = [-5, 2.5, "7", True, 2**40]


@pytest.mark.parametrize("bad", BAD_COUNTS)
def test_a_count_that_is_no_count_is_unreported_never_negative(bad: Any) -> None:
    # Neither count usable: as if no usage came (zeros in a whole answer, the estimate in a stream).
    usage = {"prompt_tokens": bad, "completion_tokens": bad, "total_tokens": bad}
    message = anthropic.message_from_chat(answer(usage=usage), request={}, message_id="m")
    assert message["usage"]["input_tokens"] == message["usage"]["output_tokens"] == 0
    stream = MessageStream(model="m", message_id="msg_test", estimated_input_tokens=7)
    stream.start()
    stream.feed({"choices": [{"delta": {"content": "12345678"}, "finish_reason": "stop"}]})
    stream.feed({"choices": [], "usage": usage})
    delta = parse_events(asyncio.run(stream.finish()))[-2][1]
    assert delta["usage"] == {"input_tokens": 7, "output_tokens": 2}
    # One count usable: the other is 0, and cache figures never make input negative.
    partial = {
        "prompt_tokens": 10,
        "completion_tokens": bad,
        "prompt_tokens_details": {"cached_tokens": bad},
    }
    message = anthropic.message_from_chat(answer(usage=partial), request={}, message_id="m")
    assert message["usage"] == {
        "input_tokens": 10,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
