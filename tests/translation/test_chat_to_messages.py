"""llmgw.translation.chat_to_messages against golden files, and round trips with the opposite
translation (``anthropic.messages_to_chat``) over arbitrary histories: what both APIs can say
(text, system prompts, tool calls and their results, over any number of turns) comes back as it
went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.errors import InvalidRequest
from llmgw.translation import anthropic
from llmgw.translation.chat_to_messages import chat_to_messages
from tests.translation.golden import cases, check_golden, load


@pytest.mark.parametrize("path", cases("chat_to_messages"), ids=lambda p: p.stem)
def test_request_translation(path: Path) -> None:
    check_golden(path, chat_to_messages(load(path)["request"]))


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ("hi", "messages"),
        ([{"role": "narrator", "content": "x"}], "messages[0].role"),
        ([{"role": "tool", "content": "x"}], "messages[0]"),
        ([{"role": "user", "content": 7}], "messages[0].content"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}],
            "messages[0].tool_calls[0].id",
        ),
    ],
)
def test_what_messages_cannot_carry_is_refused_naming_the_field(messages: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_to_messages({"model": "m", "messages": messages})
    assert refused.value.param == param


# Round trips ------------------------------------------------------------------------------------

# Text as both APIs keep it: not empty, and not ending in whitespace (a final assistant turn is
# a prefill, which Anthropic refuses with trailing whitespace, so the translation trims it).
TEXT = st.text(min_size=1, max_size=20).map(str.strip).filter(bool)
IDS = st.text("abcdefghij0123456789", min_size=4, max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
INPUTS = st.dictionaries(TEXT, JSON_VALUES, max_size=3)


@st.composite
def chat_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A system prompt (maybe), then turns: a user message, and an assistant's answer in text or
    tool calls (each answered by a tool message)."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(TEXT)})
        if not draw(st.booleans()):
            continue
        call_ids = draw(st.lists(IDS, max_size=3, unique=True))
        if not call_ids:
            messages.append({"role": "assistant", "content": draw(TEXT)})
            continue
        calls = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": draw(IDS),
                    "arguments": orjson.dumps(draw(INPUTS)).decode(),
                },
            }
            for call_id in call_ids
        ]
        messages.append(
            {"role": "assistant", "content": draw(st.none() | TEXT), "tool_calls": calls}
        )
        messages += [
            {"role": "tool", "tool_call_id": call_id, "content": draw(TEXT)} for call_id in call_ids
        ]
    return messages


def _chat_canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user message's text parts as one string (chat says the same thing either way)."""
    canonical = []
    for message in messages:
        content = message.get("content")
        if message["role"] == "user" and isinstance(content, list):
            message = {**message, "content": "".join(part["text"] for part in content)}
        canonical.append(message)
    return canonical


@given(chat_histories())
def test_a_chat_history_survives_messages_and_back(messages: list[dict[str, Any]]) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    back = anthropic.messages_to_chat(
        chat_to_messages({"model": "m", "messages": messages, "tools": tools})
    )
    assert _chat_canonical(back["messages"]) == messages
    assert back["tools"] == tools


@st.composite
def messages_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Alternating turns: user text or tool results (then maybe text), assistant text and tool uses."""
    messages: list[dict[str, Any]] = []
    pending: list[str] = []  # the tool uses the next user turn answers
    for _ in range(draw(st.integers(1, 4))):
        user: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": call_id, "content": draw(TEXT)}
            for call_id in pending
        ]
        if not pending or draw(st.booleans()):
            user.append({"type": "text", "text": draw(TEXT)})
        messages.append({"role": "user", "content": user})
        pending = draw(st.lists(IDS, max_size=2, unique=True))
        assistant: list[dict[str, Any]] = []
        if not pending or draw(st.booleans()):
            assistant.append({"type": "text", "text": draw(TEXT)})
        assistant += [
            {"type": "tool_use", "id": call_id, "name": draw(IDS), "input": draw(INPUTS)}
            for call_id in pending
        ]
        messages.append({"role": "assistant", "content": assistant})
    return messages


def _messages_canonical(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every content as blocks (a string is one text block)."""
    return [
        {**m, "content": [{"type": "text", "text": m["content"]}]}
        if isinstance(m["content"], str)
        else m
        for m in messages
    ]


@given(messages_histories(), st.none() | TEXT)
def test_a_messages_history_survives_chat_and_back(
    messages: list[dict[str, Any]], system: str | None
) -> None:
    request: dict[str, Any] = {"model": "m", "max_tokens": 100, "messages": messages}
    if system is not None:
        request["system"] = system
    back = chat_to_messages(anthropic.messages_to_chat(request))
    assert _messages_canonical(back["messages"]) == messages
    assert back.get("system") == system
    assert back["max_tokens"] == 100
