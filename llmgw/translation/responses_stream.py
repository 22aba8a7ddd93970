"""A chat completions stream as the OpenAI Responses event sequence, chunk by chunk.

    response.created, response.in_progress
    per output item, in order of appearance (reasoning, then text, then each tool call):
      response.output_item.added
      reasoning:  content_part.added, reasoning_text.delta…, reasoning_text.done, content_part.done
      message:    content_part.added, output_text.delta…, output_text.done, content_part.done
      call:       function_call_arguments.delta…, function_call_arguments.done
                  (custom tools: custom_tool_call_input.delta, .done)
      response.output_item.done (the complete item)
    response.completed | response.incomplete (the whole Response, usage included)
    or, when the stream breaks: error, then response.failed

Every event carries ``type`` and a ``sequence_number`` counting from 0, and is framed as
``event: <type>`` plus ``data: <json>``. One item is open at a time: a new kind of output closes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import orjson

from llmgw.errors import GatewayError
from llmgw.translation.chat_answer import tool_name
from llmgw.translation.responses import (
    ResponseIds,
    call_id,
    chat_tools,
    chat_usage_to_responses,
    function_call_item,
    message_item,
    reasoning_item,
    response_envelope,
    status_for_finish,
)

__all__ = ["ResponsesStreamTranslator", "response_event"]


def response_event(kind: str, payload: dict[str, Any]) -> bytes:
    """One Responses stream frame: ``event: <type>`` and its data (the SDKs read the data's
    ``type``; Codex and curl users read the ``event:`` line)."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@attrs.define
class _OpenItem:
    kind: str  # "reasoning", "message" or "call"
    item_id: str
    output_index: int
    text: list[str] = attrs.field(factory=list)
    call_index: int | None = None
    call_id: str = ""
    name: str = ""


class ResponsesStreamTranslator:
    """One stream's state; ``response`` is the final Response object once the stream ended."""

    def __init__(
        self,
        request: dict[str, Any],
        *,
        response_id: str,
        ids: ResponseIds | None = None,
        estimated_input_tokens: int = 0,
        on_finish: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        # Given the final Response of a stream that completed, before it is sent; returns it as
        # sent (the store may not have kept it).
        self._on_finish = on_finish
        self._ids = ids or ResponseIds()
        self._request = request
        self._tools = chat_tools(request.get("tools"))
        self._envelope = response_envelope(
            request, response_id=response_id, created_at=int(self._ids.clock())
        )
        self._estimated_input_tokens = estimated_input_tokens
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None
        self.response: dict[str, Any] | None = None

    # StreamTranslator ------------------------------------------------------------------------

    def start(self) -> bytes:
        return self._event("response.created", response=self._envelope) + self._event(
            "response.in_progress", response=self._envelope
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        events: list[bytes] = []
        model = chunk.get("model")
        if isinstance(model, str):
            self._envelope["model"] = model
        usage = chat_usage_to_responses(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                events.extend(self._delta(delta))
            if isinstance(choice.get("finish_reason"), str):
                self._finish_reason = choice["finish_reason"]
        return b"".join(events)

    async def finish(self) -> bytes:
        events = self._close()
        status, incomplete = status_for_finish(self._finish_reason)
        usage = self._usage
        if usage is None:
            # No usage reported: the input estimate, so clients never read zeros as "free".
            usage = chat_usage_to_responses(
                {"prompt_tokens": self._estimated_input_tokens, "completion_tokens": 0}
            )
        response = {
            **self._envelope,
            "status": status,
            "incomplete_details": incomplete,
            "output": list(self._output),
            "usage": usage,
        }
        if self._on_finish is not None:
            response = await self._on_finish(response)
        self.response = response
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return events + self._event(kind, response=response)

    def error(self, error: GatewayError) -> bytes:
        events = self._close()
        failure = {"code": "server_error", "message": error.message}
        response = {
            **self._envelope,
            "status": "failed",
            "error": failure,
            "output": list(self._output),
            "usage": self._usage,
        }
        self.response = response
        return (
            events
            + self._event("error", code=error.code, message=error.message, param=error.param)
            + self._event("response.failed", response=response)
        )

    # Deltas ----------------------------------------------------------------------------------

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        reasoning = delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            events.extend(self._text("reasoning", reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            events.extend(self._text("message", content))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict):
                events.extend(self._tool_call(call))
        return events

    def _text(self, kind: str, fragment: str) -> list[bytes]:
        events: list[bytes] = []
        item = self._open
        if item is None or item.kind != kind:
            events.append(self._close())
            item = self._begin(kind, "rs" if kind == "reasoning" else "msg")
            added = (
                reasoning_item(item.item_id, "")
                if kind == "reasoning"
                else message_item(item.item_id, "")
            )
            added["content"] = []
            if kind == "message":
                added["status"] = "in_progress"
            events.append(self._added(item, added))
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    content_index=0,
                    part=self._part(kind, ""),
                )
            )
        item.text.append(fragment)
        delta_type = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        events.append(
            self._event(
                delta_type,
                item_id=item.item_id,
                output_index=item.output_index,
                content_index=0,
                delta=fragment,
                **extra,
            )
        )
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        index = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        item = self._open
        if item is None or item.kind != "call" or item.call_index != index:
            # A call's first fragment names it (what every backend does): its item starts here.
            name = tool_name(function.get("name"))
            events.append(self._close())
            item = self._begin("call", "fc")
            item.call_index = index
            item.call_id = call_id(call, self._ids)
            item.name = name
            added = self._call_item(item, "", status="in_progress")
            events.append(self._added(item, added))
        fragment = function.get("arguments")
        if isinstance(fragment, str) and fragment:
            item.text.append(fragment)
            if not self._tools.call(item.name).custom:
                # A custom tool's input is the "input" string inside these JSON fragments: it
                # is sent whole when the call is complete.
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item.item_id,
                        output_index=item.output_index,
                        delta=fragment,
                    )
                )
        return events

    # Items -----------------------------------------------------------------------------------

    def _begin(self, kind: str, prefix: str) -> _OpenItem:
        item = _OpenItem(kind, self._ids.new_id(prefix), len(self._output))
        self._open = item
        return item

    def _added(self, item: _OpenItem, added: dict[str, Any]) -> bytes:
        return self._event("response.output_item.added", output_index=item.output_index, item=added)

    def _call_item(self, item: _OpenItem, arguments: str, *, status: str) -> dict[str, Any]:
        return function_call_item(
            item.item_id,
            item.call_id,
            item.name,
            arguments,
            tools=self._tools,
            status=status,
        )

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _close(self) -> bytes:
        """The closing events of the open item, which joins the output; b"" when none is open."""
        item = self._open
        if item is None:
            return b""
        self._open = None
        text = "".join(item.text)
        where = {"item_id": item.item_id, "output_index": item.output_index}
        events: list[bytes] = []
        if item.kind == "call":
            done = self._call_item(item, text, status="completed")
            if done["type"] == "custom_tool_call":
                events.append(
                    self._event(
                        "response.custom_tool_call_input.delta", **where, delta=done["input"]
                    )
                )
                events.append(
                    self._event(
                        "response.custom_tool_call_input.done", **where, input=done["input"]
                    )
                )
            else:
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        **where,
                        name=item.name,
                        arguments=text,
                    )
                )
        else:
            reasoning = item.kind == "reasoning"
            done_type = "response.reasoning_text.done" if reasoning else "response.output_text.done"
            extra: dict[str, Any] = {} if reasoning else {"logprobs": []}
            events.append(self._event(done_type, **where, content_index=0, text=text, **extra))
            events.append(
                self._event(
                    "response.content_part.done",
                    **where,
                    content_index=0,
                    part=self._part(item.kind, text),
                )
            )
            done = (
                reasoning_item(item.item_id, text)
                if reasoning
                else message_item(item.item_id, text)
            )
        self._output.append(done)
        events.append(
            self._event("response.output_item.done", output_index=item.output_index, item=done)
        )
        return b"".join(events)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return response_event(kind, payload)
