"""A whole Anthropic Messages answer and its stream, one made from the other, losslessly: what
replays a cached answer of a provider that speaks Messages itself (a native ``/v1/messages``) in the
form a later request asks for. Every block comes back as it was, thinking signatures, citations and
server tool results included; a block without a delta of its own is sent whole at its start."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from llmgw.providers.sse import event_data
from llmgw.translation.anthropic_stream import sse_event

__all__ = ["message_events", "message_from_events"]

# What each block's delta carries, and the empty value its start carries instead.
_STREAMED = {
    "text": (("text", "text_delta", ""),),
    "thinking": (("thinking", "thinking_delta", ""), ("signature", "signature_delta", "")),
}
_INPUTS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def message_events(message: dict[str, Any]) -> tuple[bytes, ...]:
    """The events of the stream that makes ``message``, ``message_start`` to ``message_stop``."""
    usage = message.get("usage")
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    events = [sse_event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message.get("content") or ()):
        events.extend(_block_events(index, block))
    delta = {
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
    }
    finish: dict[str, Any] = {"type": "message_delta", "delta": delta}
    if isinstance(usage, dict):
        finish["usage"] = usage
    events.append(sse_event("message_delta", finish))
    events.append(sse_event("message_stop", {"type": "message_stop"}))
    return tuple(events)


def _block_events(index: int, block: Any) -> Iterable[bytes]:
    kind = block.get("type") if isinstance(block, dict) else None
    deltas: list[dict[str, Any]] = []
    opened = block
    if kind in _STREAMED:
        opened = dict(block)
        for field, delta_type, empty in _STREAMED[kind]:
            value = block.get(field)
            if isinstance(value, str):
                opened[field] = empty
                if value:
                    deltas.append({"type": delta_type, field: value})
    elif kind in _INPUTS and "input" in block:
        opened = {**block, "input": {}}
        deltas.append(
            {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
        )
    yield sse_event(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": opened},
    )
    for delta in deltas:
        yield sse_event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
    yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})


def message_from_events(events: Iterable[bytes]) -> dict[str, Any]:
    """The message a complete stream's events make (what the SDKs' accumulators make of it)."""
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, str] = {}
    for event in events:
        data = event_data(event)
        document = orjson.loads(data) if data else None
        if not isinstance(document, dict):
            continue
        kind, index = document.get("type"), document.get("index")
        if kind == "message_start":
            message = dict(document.get("message") or {})
        elif kind == "content_block_start" and isinstance(index, int):
            blocks[index] = dict(document.get("content_block") or {})
        elif kind == "content_block_delta" and index in blocks:
            _add_delta(blocks[index], inputs, index, document.get("delta") or {})
        elif kind == "content_block_stop" and index in inputs:
            blocks[index]["input"] = orjson.loads(inputs.pop(index) or "{}")
        elif kind == "message_delta":
            message.update(document.get("delta") or {})
            usage = document.get("usage")
            if isinstance(usage, dict):
                reported = {name: value for name, value in usage.items() if value is not None}
                message["usage"] = {**(message.get("usage") or {}), **reported}
    message["content"] = [blocks[index] for index in sorted(blocks)]
    return message


def _add_delta(
    block: dict[str, Any], inputs: dict[int, str], index: int, delta: dict[str, Any]
) -> None:
    kind = delta.get("type")
    if kind == "input_json_delta":
        inputs[index] = inputs.get(index, "") + str(delta.get("partial_json") or "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature")
    else:
        for field in ("text", "thinking"):
            if kind == f"{field}_delta":
                block[field] = str(block.get(field) or "") + str(delta.get(field) or "")
