"""A whole chat completion (a JSON answer to a streamed request) as the events of a stream.

Some providers answer ``"stream": true`` with an ordinary 200 JSON completion. The caller asked for
a stream, so it gets one: a chunk with each choice's message as its delta and finish reason, then a
usage chunk (hidden like any other when the caller did not ask for usage), then ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["completion_events"]

_DONE_EVENT = b"data: [DONE]\n\n"
_CHUNK_FIELDS = ("id", "created", "model", "system_fingerprint", "service_tier")
_DELTA_FIELDS = ("role", "content", "reasoning_content", "refusal")


def completion_events(completion: dict[str, Any]) -> bytes:
    """The completion as SSE events; anything that is not one (an error object) as one event."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        return _event(completion) + _DONE_EVENT
    head: dict[str, Any] = {key: completion[key] for key in _CHUNK_FIELDS if key in completion}
    head["object"] = "chat.completion.chunk"
    deltas = [_choice_delta(choice) for choice in choices if isinstance(choice, dict)]
    events = [_event({**head, "choices": deltas})]
    if "usage" in completion:
        billing: dict[str, Any] = {
            key: completion[key] for key in ("usage", "cost") if key in completion
        }
        events.append(_event({**head, "choices": [], **billing}))
    events.append(_DONE_EVENT)
    return b"".join(events)


def _choice_delta(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    delta = {key: message[key] for key in _DELTA_FIELDS if message.get(key) is not None}
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        # Stream deltas number their tool calls; a whole message does not.
        delta["tool_calls"] = [
            {**call, "index": index}
            for index, call in enumerate(tool_calls)
            if isinstance(call, dict)
        ]
    return {
        "index": choice.get("index", 0),
        "delta": delta,
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
    }


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"
