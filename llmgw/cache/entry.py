"""A cached answer: the provider's own bytes plus what replays it in the other form.

An answer is kept as it came: a JSON answer as its body, a streamed chat answer as its events
(without ``[DONE]``). A JSON answer is replayed to a streamed request as the chunks of that
completion, and a streamed one to a JSON request as the completion its chunks make; text, tool
calls, reasoning, finish reasons and usage are the same either way. An answer in Anthropic's own
Messages form (a provider that speaks it, on a native ``/v1/messages``) is kept and replayed in
that form (``llmgw.cache.messages``). The usage and the cost the
answer had when it was fetched are kept beside it: a hit's ledger row and what it saved.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from llmgw.accounting.usage import Usage
from llmgw.cache.messages import message_events, message_from_events
from llmgw.providers.sse import SSEScanner, event_data
from llmgw.streaming.completion import completion_events

__all__ = ["Entry", "assemble_completion", "decode_entry", "encode_entry"]

_DONE = b"[DONE]"


@attrs.frozen
class Entry:
    stored_at: float  # clock seconds
    ttl: float
    usage: Usage  # as reported (cost_usd: what the answer cost, what a hit saves)
    body: bytes | None = None  # a JSON answer as the provider sent it
    events: tuple[bytes, ...] | None = None  # a streamed chat answer's events, no [DONE]
    response_model: str | None = None
    messages: bool = False  # Anthropic's Messages form (its message, its events), not chat's

    def age(self, now: float) -> float:
        return max(0.0, now - self.stored_at)

    def fresh(self, now: float) -> bool:
        return now < self.stored_at + self.ttl

    def json_body(self) -> bytes:
        if self.body is not None:
            return self.body  # sent as it is: no re-encoding
        if self.messages:
            return orjson.dumps(message_from_events(self.chunk_events()))
        return orjson.dumps(assemble_completion(self.chunk_events()))

    def chunk_events(self) -> tuple[bytes, ...]:
        """The answer as chat chunk events (a JSON completion made into them), no ``[DONE]``; or
        as Messages events, ``message_start`` to ``message_stop``."""
        if self.events is not None:
            return self.events
        assert self.body is not None
        if self.messages:
            return message_events(orjson.loads(self.body))
        events = SSEScanner(1 << 62).feed(completion_events(orjson.loads(self.body)))
        return tuple(e for e in events if event_data(e) != _DONE)


def encode_entry(entry: Entry) -> bytes:
    document: dict[str, Any] = {
        "at": entry.stored_at,
        "ttl": entry.ttl,
        # No extras: a hit paid no provider (its row has none).
        "usage": attrs.asdict(entry.usage, filter=attrs.filters.exclude("extras")),
        "model": entry.response_model,
        "messages": entry.messages,
    }
    if entry.body is not None:
        document["body"] = entry.body.decode()
    if entry.events is not None:
        document["events"] = [e.decode() for e in entry.events]
    return orjson.dumps(document)


def decode_entry(raw: bytes) -> Entry | None:
    """None for anything that is not an entry (another version's, a damaged one): a miss."""
    try:
        document = orjson.loads(raw)
        events = document.get("events")
        body = document.get("body")
        return Entry(
            stored_at=float(document["at"]),
            ttl=float(document["ttl"]),
            usage=Usage(**document["usage"]),
            body=None if body is None else body.encode(),
            events=None if events is None else tuple(e.encode() for e in events),
            response_model=document.get("model"),
            messages=document.get("messages") is True,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def assemble_completion(events: tuple[bytes, ...]) -> dict[str, Any]:
    """The chat completion a stream's chunks make: each choice's text, reasoning and tool calls
    joined, its finish reason, and the usage chunk's usage."""
    completion: dict[str, Any] = {"object": "chat.completion"}
    choices: dict[int, dict[str, Any]] = {}
    for event in events:
        data = event_data(event)
        if not data or data == _DONE:
            continue
        chunk = orjson.loads(data)
        for field in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if field in chunk and field not in completion:
                completion[field] = chunk[field]
        for field in ("usage", "cost"):
            if chunk.get(field) is not None:
                completion[field] = chunk[field]
        for delta_choice in chunk.get("choices") or ():
            index = delta_choice.get("index", 0)
            choice = choices.setdefault(
                index,
                {"index": index, "message": {"role": "assistant", "content": None}},
            )
            _add_delta(choice["message"], delta_choice.get("delta") or {})
            if delta_choice.get("finish_reason") is not None:
                choice["finish_reason"] = delta_choice["finish_reason"]
            choice.setdefault("logprobs", delta_choice.get("logprobs"))
    completion["choices"] = [choices[i] for i in sorted(choices)]
    return completion


def _add_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    for field in ("content", "reasoning_content", "refusal"):
        text = delta.get(field)
        if isinstance(text, str):
            message[field] = (message.get(field) or "") + text
    if isinstance(delta.get("role"), str):
        message["role"] = delta["role"]
    calls: list[dict[str, Any]] = message.setdefault("tool_calls", [])
    for part in delta.get("tool_calls") or ():
        index = part.get("index", len(calls))
        while len(calls) <= index:
            calls.append(
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
        call = calls[index]
        if part.get("id"):
            call["id"] = part["id"]
        if part.get("type"):
            call["type"] = part["type"]
        function = part.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""
    if not calls:
        del message["tool_calls"]
