"""Chat completion chunks → Anthropic Messages stream events, as they arrive.

    message_start, ping
    (content_block_start, content_block_delta*, content_block_stop)*   one block open at a time
    message_delta (stop_reason, cumulative usage), message_stop        or one ``error`` event

Block indexes are positions in the final ``content`` (0, 1, 2, …): the SDKs append on
``content_block_start`` and address ``content[index]``. ``reasoning_content`` becomes a thinking
block, ``content`` a text block, each new tool call a tool_use block whose argument fragments are
``input_json_delta``s. The finish reason is held until usage arrives (on the finish chunk or on a
later ``choices: []`` chunk, depending on the backend) so ``message_delta`` carries the provider's
figures; ``message_start`` carries the gateway's estimate, since the provider reports at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from llmgw.accounting.estimate import estimate_output_tokens
from llmgw.errors import GatewayError
from llmgw.translation.anthropic import (
    error_body,
    is_one_of,
    new_tool_use_id,
    stop_reason,
    usage_fields,
)
from llmgw.translation.chat_answer import tool_name

__all__ = ["MessageStream", "error_event", "sse_event"]


def sse_event(name: str, payload: dict[str, Any]) -> bytes:
    """One SSE frame; both Anthropic SDKs dispatch on the ``event:`` name and drop frames without."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def error_event(error: GatewayError) -> bytes:
    """The gateway's error in a Messages stream, as Anthropic sends one: an ``error`` event (the
    anthropic SDKs raise on it; a frame without the name they skip, ending with no stop reason)."""
    return sse_event("error", error_body(error.status, error.message))


class MessageStream:
    """The state of one translated stream; implements ``StreamTranslator``."""

    def __init__(
        self,
        *,
        model: Any,
        message_id: str,
        estimated_input_tokens: int,
        stop_sequences: Sequence[str] = (),
        new_tool_id: Callable[[], str] = new_tool_use_id,
    ) -> None:
        self._model = model
        self._message_id = message_id
        self._estimated_input_tokens = max(1, estimated_input_tokens)
        self._stop_sequences = frozenset(stop_sequences)
        self._new_tool_id = new_tool_id
        self._next_index = 0
        self._open: str | None = None  # the type of the open block
        self._open_tool: int | None = None  # the chat tool-call index the open block belongs to
        self._tools_seen: set[int] = set()
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None
        self._usage: dict[str, int] | None = None
        self._output_chars = 0
        self._done = False

    # -- StreamTranslator ---------------------------------------------------------------------

    def start(self) -> bytes:
        message = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self._estimated_input_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return sse_event("message_start", {"type": "message_start", "message": message}) + (
            sse_event("ping", {"type": "ping"})
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if self._done:
            return b""  # anything after the end (or an error) is dropped
        out: list[bytes] = []
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(choice, dict):
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, out)
            self._hold_finish(choice)
        usage = usage_fields(chunk)
        if usage is not None:
            self._usage = usage
        if self._stop_reason is not None and self._usage is not None:
            out.append(self._close())
        return b"".join(out)

    async def finish(self) -> bytes:
        return b"" if self._done else self._close()

    def error(self, error: GatewayError) -> bytes:
        if self._done:
            return b""
        self._done = True  # nothing follows an error event
        return error_event(error)

    # -- blocks -------------------------------------------------------------------------------

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            self._ensure_open(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""}, out
            )
            self._emit_delta({"type": "thinking_delta", "thinking": reasoning}, out)
            self._output_chars += len(reasoning)
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._ensure_open("text", {"type": "text", "text": ""}, out)
            self._emit_delta({"type": "text_delta", "text": text}, out)
            self._output_chars += len(text)
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._tool_call(call, out)

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if index not in self._tools_seen:
            # A call's first fragment names it (what every backend does): its block starts here.
            name = tool_name(function.get("name"))
            self._tools_seen.add(index)
            call_id = call.get("id")
            block = {
                "type": "tool_use",
                "id": call_id if isinstance(call_id, str) and call_id else self._new_tool_id(),
                "name": name,
                "input": {},
            }
            self._open_block("tool_use", block, out)
            self._open_tool = index
        elif index != self._open_tool:
            # A fragment for a call whose block is already closed: blocks are never reopened
            # (the SDKs address content[index] in start order). No known backend interleaves.
            return
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._emit_delta({"type": "input_json_delta", "partial_json": arguments}, out)
            self._output_chars += len(arguments)

    def _ensure_open(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        if self._open != kind:
            self._open_block(kind, block, out)

    def _open_block(self, kind: str, block: dict[str, Any], out: list[bytes]) -> None:
        self._close_block(out)
        self._open = kind
        out.append(
            sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": self._next_index, "content_block": block},
            )
        )

    def _emit_delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        out.append(
            sse_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": self._next_index, "delta": delta},
            )
        )

    def _close_block(self, out: list[bytes]) -> None:
        if self._open is None:
            return
        out.append(
            sse_event(
                "content_block_stop", {"type": "content_block_stop", "index": self._next_index}
            )
        )
        self._open = None
        self._open_tool = None
        self._next_index += 1

    # -- the end ------------------------------------------------------------------------------

    def _hold_finish(self, choice: dict[str, Any]) -> None:
        finish_reason = choice.get("finish_reason")
        if finish_reason is None:
            return
        self._stop_reason = stop_reason(finish_reason)
        matched = choice.get("stop_reason")
        if self._stop_reason == "end_turn" and is_one_of(matched, self._stop_sequences):
            self._stop_reason, self._stop_sequence = "stop_sequence", matched

    def _close(self) -> bytes:
        out: list[bytes] = []
        self._close_block(out)
        reason = self._stop_reason or "end_turn"
        if self._tools_seen and reason == "end_turn":
            reason = "tool_use"  # some backends end tool calls with "stop"
        usage = self._usage or {
            "input_tokens": self._estimated_input_tokens,
            "output_tokens": estimate_output_tokens(self._output_chars),
        }
        out.append(
            sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": self._stop_sequence},
                    "usage": usage,
                },
            )
        )
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        self._done = True
        return b"".join(out)
