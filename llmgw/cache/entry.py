"""A cached answer: the provider's own bytes plus what replays it in the other form.

An answer is kept as it came: a JSON answer as its body, a streamed chat answer as its events
(without ``[DONE]``). A JSON answer is replayed to a streamed request as the chunks of that
completion, and a streamed one to a JSON request as the completion its chunks make; text, tool
calls, reasoning, finish reasons and usage are the same either way. An answer of a provider's own
API (Anthropic's Messages on a native ``/v1/messages``, OpenAI's Responses on a native
``/v1/responses``) is kept and replayed in that API's form (``llmgw.cache.messages``,
``llmgw.cache.responses``). The usage and the cost the answer had when it was fetched are kept
beside it: a hit's ledger row and what it saved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import attrs
import orjson

from llmgw.accounting.usage import Usage
from llmgw.cache.messages import message_events, message_from_events
from llmgw.cache.responses import response_events, response_from_events
from llmgw.providers.sse import SSEScanner, event_data
from llmgw.streaming.completion import completion_events

__all__ = ["Entry", "Form", "assemble_completion", "decode_entry", "encode_entry"]

_DONE = b"[DONE]"

# The API an answer is kept in: chat's (every translated one), or a provider's own.
Form = Literal["chat", "messages", "responses"]


@attrs.frozen
class _Replays:
    whole: Callable[[Sequence[bytes]], dict[str, Any]]  # the answer a complete stream makes
    events: Callable[[dict[str, Any]], tuple[bytes, ...]]  # the stream that makes an answer


@attrs.frozen
class Entry:
    stored_at: float  # clock seconds
    ttl: float
    usage: Usage  # as reported (cost_usd: what the answer cost, what a hit saves)
    body: bytes | None = None  # a JSON answer as the provider sent it
    events: tuple[bytes, ...] | None = None  # a streamed answer's events (chat's: no [DONE])
    response_model: str | None = None
    form: Form = "chat"

    def age(self, now: float) -> float:
        return max(0.0, now - self.stored_at)

    def fresh(self, now: float) -> bool:
        return now < self.stored_at + self.ttl

    def json_body(self) -> bytes:
        if self.body is not None:
            return self.body  # sent as it is: no re-encoding
        return orjson.dumps(_FORMS[self.form].whole(self.chunk_events()))

    def chunk_events(self) -> tuple[bytes, ...]:
        """The answer as its form's events (a JSON answer made into them): chat chunks without
        ``[DONE]``, Messages ``message_start`` to ``message_stop``, Responses
        ``response.created`` to ``response.completed``."""
        if self.events is not None:
            return self.events
        assert self.body is not None
        return _FORMS[self.form].events(orjson.loads(self.body))


def encode_entry(entry: Entry) -> bytes:
    document: dict[str, Any] = {
        "at": entry.stored_at,
        "ttl": entry.ttl,
        # No extras: a hit paid no provider (its row has none).
        "usage": attrs.asdict(entry.usage, filter=attrs.filters.exclude("extras")),
        "model": entry.response_model,
        "form": entry.form,
        # What a replica of the version before forms reads (a rolling upgrade shares Redis).
        "messages": entry.form == "messages",
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
        # An entry of the version before forms says only whether it is Messages.
        form = document.get("form", "messages" if document.get("messages") is True else "chat")
        if form not in _FORMS:
            return None
        return Entry(
            stored_at=float(document["at"]),
            ttl=float(document["ttl"]),
            usage=Usage(**document["usage"]),
            body=None if body is None else body.encode(),
            events=None if events is None else tuple(e.encode() for e in events),
            response_model=document.get("model"),
            form=form,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def assemble_completion(events: Iterable[bytes]) -> dict[str, Any]:
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


def _completion_events(completion: dict[str, Any]) -> tuple[bytes, ...]:
    """A JSON completion as the chunk events of its stream, no ``[DONE]``."""
    events = SSEScanner(1 << 62).feed(completion_events(completion))
    return tuple(e for e in events if event_data(e) != _DONE)


_FORMS: dict[str, _Replays] = {
    "chat": _Replays(assemble_completion, _completion_events),
    "messages": _Replays(message_from_events, message_events),
    "responses": _Replays(response_from_events, response_events),
}


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
