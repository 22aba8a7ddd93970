"""Anthropic Messages answers → OpenAI chat completions: the answer, the stream and the errors of an
Anthropic upstream as a chat caller gets them (the inverse of ``anthropic.message_from_chat`` and
``anthropic_stream``). Pure functions and a small state machine, no I/O.

Usage follows chat's convention, where cache counts are parts of the input: ``prompt_tokens`` is
Anthropic's input plus its cache reads and writes (see ``messages_usage``). Thinking becomes
``reasoning_content`` (its signature has no chat field and is dropped), ``redacted_thinking`` and
server-tool blocks are dropped.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from llmgw.accounting.messages_usage import MessagesUsage
from llmgw.errors import ProviderError
from llmgw.translation.anthropic import error_type
from llmgw.translation.chat_chunk import ChatChunkHead

__all__ = ["ChatChunks", "chat_error_body", "completion_from_message", "finish_reason"]

_FINISH_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def finish_reason(stop_reason: Any) -> str:
    return _FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def completion_from_message(message: dict[str, Any], *, created: int) -> dict[str, Any]:
    """The chat completion for a non-streamed Messages answer."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    content = message.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_tool_call(block))
    answer: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if thinking:
        answer["reasoning_content"] = "".join(thinking)
    if calls:
        answer["tool_calls"] = calls
    completion: dict[str, Any] = {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": answer,
                "finish_reason": finish_reason(message.get("stop_reason")),
                "logprobs": None,
            }
        ],
    }
    usage = message.get("usage")
    if isinstance(usage, dict):
        completion["usage"] = MessagesUsage().merge(usage).chat_usage()
    return completion


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {
            "name": block.get("name"),
            "arguments": orjson.dumps(block.get("input", {})).decode(),
        },
    }


def chat_error_body(status: int, body: bytes) -> bytes:
    """An Anthropic error answer as OpenAI's error object, with its status's type and the
    provider's own message."""
    message = ProviderError.from_answer(status, body, retry_after=None).message
    error = {"message": message, "type": _error_type(body) or error_type(status)}
    return orjson.dumps({"error": {**error, "param": None, "code": None}})


def _error_type(body: bytes) -> str | None:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = document.get("error") if isinstance(document, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


class ChatChunks:
    """Turns one Messages event stream, event by event, into chat completion chunks.

    Blocks are numbered by Anthropic in one sequence; chat numbers only its tool calls, so each
    tool_use block gets the next tool call index. ``message_delta``'s usage is cumulative: it
    updates the counts ``message_start`` gave rather than adding to them.
    """

    def __init__(self, *, created: int, include_usage: bool, trimmed_prefill: bool = False) -> None:
        self._head = ChatChunkHead(None, created, None)
        self._include_usage = include_usage
        # The request continued an assistant text whose trailing whitespace had to be trimmed
        # (chat_to_messages): the caller has that whitespace, so the continuation's is dropped.
        self._strip_leading_space = trimmed_prefill
        self._usage = MessagesUsage()
        self._tool_index: dict[int, int] = {}  # block index -> tool call index

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any] | bytes]:
        """The chunks (dicts) for one decoded event; ``[DONE]`` (bytes) after the last."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            message = message if isinstance(message, dict) else {}
            self._head.id, self._head.model = message.get("id"), message.get("model")
            self._usage.merge(message.get("usage"))
            return [self._head.chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            return self._block_start(event)
        if kind == "content_block_delta":
            return self._block_delta(event)
        if kind == "message_delta":
            self._usage.merge(event.get("usage"))
            delta = event.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            return [] if reason is None else [self._head.chunk({}, finish_reason(reason))]
        if kind == "message_stop":
            last: list[dict[str, Any] | bytes] = []
            if self._include_usage:
                last.append(self._head.usage_chunk(self._usage.chat_usage()))
            return [*last, b"[DONE]"]
        if kind == "error":
            error = event.get("error")
            error = error if isinstance(error, dict) else {}
            return [{"error": {"message": error.get("message"), "type": error.get("type")}}]
        return []  # ping, and event types newer than this code

    def _block_start(self, event: dict[str, Any]) -> list[dict[str, Any] | bytes]:
        block = event.get("content_block")
        index = event.get("index")
        if not isinstance(block, dict) or block.get("type") != "tool_use" or index is None:
            return []  # text and thinking blocks start empty: their deltas carry the text
        position = self._tool_index[index] = len(self._tool_index)
        call = {
            "index": position,
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": ""},
        }
        return [self._head.chunk({"tool_calls": [call]})]

    def _block_delta(self, event: dict[str, Any]) -> list[dict[str, Any] | bytes]:
        delta = event.get("delta")
        if not isinstance(delta, dict):
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if self._strip_leading_space and isinstance(text, str):
                text = text.lstrip()
                self._strip_leading_space = not text
            return [self._head.chunk({"content": text})] if text != "" else []
        if kind == "thinking_delta":
            return [self._head.chunk({"reasoning_content": delta.get("thinking")})]
        if kind == "input_json_delta" and event.get("index") in self._tool_index:
            call = {
                "index": self._tool_index[event["index"]],
                "function": {"arguments": delta.get("partial_json")},
            }
            return [self._head.chunk({"tool_calls": [call]})]
        return []  # signature_delta and the like: nothing chat can carry
