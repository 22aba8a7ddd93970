"""Token estimates for when a provider's own count is not (yet) known.

Used for reservations (a request's worst case before it is sent), for Anthropic's ``count_tokens``,
for ``message_start`` of translated streams, and for the record of a stream whose usage never came.
About four bytes of JSON per token is what BPE tokenizers give for English text and code; counting the
serialized messages (keys and punctuation included) errs on the high side, which is the safe side for
a reservation.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import orjson

__all__ = [
    "BYTES_PER_TOKEN",
    "answer_output_chars",
    "argument_chars",
    "estimate_input_tokens",
    "estimate_output_tokens",
    "worst_case_output_tokens",
]

BYTES_PER_TOKEN = 4
# Fields of a chat completions body that reach the model's context (and of a Messages body
# forwarded as it came: its ``system`` prompt, Claude Code's largest part, is one).
_PROMPT_FIELDS = ("messages", "tools", "functions", "input", "prompt", "system")
# Messages content blocks whose ``input`` the model wrote (a server tool's too).
_TOOL_USES = frozenset({"tool_use", "server_tool_use"})


def estimate_input_tokens(chat_body: dict[str, Any]) -> int:
    """Input tokens of a chat completions (embeddings, Messages) body; at least 1."""
    size = 0
    for field in _PROMPT_FIELDS:
        value = chat_body.get(field)
        if value is not None:
            size += len(value.encode()) if isinstance(value, str) else len(orjson.dumps(value))
    return max(1, math.ceil(size / BYTES_PER_TOKEN))


def argument_chars(tool_calls: Any) -> int:
    """Characters of the arguments in a message's (or a chunk's delta's) ``tool_calls``, which
    the model produced and so count as output; 0 for anything that is not such a list."""
    chars = 0
    for call in tool_calls if isinstance(tool_calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            chars += len(arguments)
    return chars


def answer_output_chars(document: dict[str, Any]) -> int:
    """Characters a whole answer's model produced (for an estimate of its output tokens): a chat
    completion's content and tool-call arguments, or a Messages answer's content blocks (text,
    thinking, tool_use input as JSON), as a stream of either is counted."""
    size = 0
    choices = document.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        size += len(content) if isinstance(content, str) else 0
        size += argument_chars(message.get("tool_calls"))
    blocks = document.get("content") if document.get("type") == "message" else None
    for block in blocks if isinstance(blocks, list) else ():
        if not isinstance(block, dict):
            continue
        for field in ("text", "thinking"):
            text = block.get(field)
            size += len(text) if isinstance(text, str) else 0
        if block.get("type") in _TOOL_USES and "input" in block:
            with contextlib.suppress(orjson.JSONEncodeError):  # nested past what orjson writes
                size += len(orjson.dumps(block["input"]))
    return size


def estimate_output_tokens(output_chars: int) -> int:
    """Output tokens of ``output_chars`` characters the provider produced (content, tool arguments)."""
    return math.ceil(max(0, output_chars) / BYTES_PER_TOKEN)


def worst_case_output_tokens(
    chat_body: dict[str, Any], *, model_max: int | None, default_max: int
) -> int:
    """The most output tokens a chat request can produce: what it asks for (``max_completion_tokens``,
    else ``max_tokens``), else the model's maximum capped by ``default_max``; times ``n`` choices."""
    asked = next(
        (
            value
            for value in (chat_body.get("max_completion_tokens"), chat_body.get("max_tokens"))
            if isinstance(value, int) and not isinstance(value, bool) and value > 0
        ),
        None,
    )
    if asked is None:
        asked = default_max if model_max is None else min(model_max, default_max)
    choices = chat_body.get("n")
    if not isinstance(choices, int) or isinstance(choices, bool) or choices < 1:
        choices = 1
    return asked * choices
