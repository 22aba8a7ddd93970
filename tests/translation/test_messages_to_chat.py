"""llmgw.translation.messages_to_chat against golden files (answers, streams), the error shape a
chat caller gets, and a round trip with the opposite translation (``anthropic.message_from_chat``):
a Messages answer's text, thinking, tool uses, stop reason and four token counts survive chat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.translation import anthropic
from llmgw.translation.messages_to_chat import ChatChunks, chat_error_body, completion_from_message
from tests.translation.golden import cases, check_golden, load
from tests.translation.test_chat_to_messages import IDS, INPUTS, TEXT


@pytest.mark.parametrize("path", cases("messages_to_chat/response"), ids=lambda p: p.stem)
def test_answer_translation(path: Path) -> None:
    check_golden(path, completion_from_message(load(path)["message"], created=1700000000))


@pytest.mark.parametrize("path", cases("messages_to_chat/stream"), ids=lambda p: p.stem)
def test_stream_translation(path: Path) -> None:
    case = load(path)
    chunks = ChatChunks(created=1700000000, include_usage=case["include_usage"])
    out = [c if isinstance(c, dict) else c.decode() for e in case["events"] for c in chunks.feed(e)]
    check_golden(path, out)


def test_an_anthropic_error_keeps_its_status_message_and_type_in_openais_shape() -> None:
    body = orjson.dumps(anthropic.error_body(529, "Overloaded"))
    assert orjson.loads(chat_error_body(529, body)) == {
        "error": {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": None}
    }
    # A body that is no Anthropic error: the status's type and a sentence of the gateway's.
    assert orjson.loads(chat_error_body(502, b"<html>bad gateway</html>"))["error"] == {
        "message": "The provider answered 502.",
        "type": "api_error",
        "param": None,
        "code": None,
    }


COUNTS = st.integers(0, 10**6)


@st.composite
def answers(draw: st.DrawFn) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if draw(st.booleans()):
        content.append({"type": "thinking", "thinking": draw(TEXT), "signature": ""})
    if draw(st.booleans()):
        content.append({"type": "text", "text": draw(TEXT)})
    calls = draw(st.lists(IDS, max_size=3, unique=True))
    content += [
        {"type": "tool_use", "id": i, "name": draw(IDS), "input": draw(INPUTS)} for i in calls
    ]
    usage = {
        "input_tokens": draw(COUNTS),
        "output_tokens": draw(COUNTS),
        "cache_creation_input_tokens": draw(COUNTS),
        "cache_read_input_tokens": draw(COUNTS),
    }
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": content,
        "stop_reason": "tool_use" if calls else draw(st.sampled_from(["end_turn", "max_tokens"])),
        "stop_sequence": None,
        "usage": usage,
    }


@given(answers())
def test_a_messages_answer_survives_chat_and_back(message: dict[str, Any]) -> None:
    completion = completion_from_message(message, created=0)
    back = anthropic.message_from_chat(completion, request={"model": "claude"}, message_id="msg_1")
    assert back == message
