"""A whole chat completion answered to a streamed request becomes the stream the caller asked
for: one chunk with each choice's message as its delta, a usage chunk, then [DONE]."""

from __future__ import annotations

from typing import Any

import orjson

from llmgw.streaming.completion import completion_events


def events(raw: bytes) -> list[Any]:
    assert raw.endswith(b"data: [DONE]\n\n")
    parts = raw.split(b"\n\n")[:-2]  # the last two: [DONE] and what follows its blank line
    assert all(part.startswith(b"data: ") for part in parts)
    return [orjson.loads(part[6:]) for part in parts]


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "qwen3-5-9b",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            "finish_reason": "tool_calls",
        },
        {"index": 1, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"},
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    "cost": {"usd": 0.001},
}


def test_a_completion_becomes_a_chunk_a_usage_chunk_and_done() -> None:
    chunk, usage = events(completion_events(COMPLETION))
    head = {"id": "chatcmpl-1", "created": 1700000000, "model": "qwen3-5-9b"}
    assert chunk == {
        **head,
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": {  # no null content; tool calls numbered as stream deltas number them
                    "role": "assistant",
                    "tool_calls": [
                        {**call, "index": index}
                        for index, call in enumerate(
                            COMPLETION["choices"][0]["message"]["tool_calls"]
                        )  # type: ignore[index]
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            },
            {
                "index": 1,
                "delta": {"role": "assistant", "content": "hi"},
                "logprobs": None,
                "finish_reason": "stop",
            },
        ],
    }
    assert usage == {
        **head,
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": COMPLETION["usage"],
        "cost": COMPLETION["cost"],
    }


def test_without_usage_there_is_no_usage_chunk() -> None:
    completion = {key: value for key, value in COMPLETION.items() if key not in ("usage", "cost")}
    [chunk] = events(completion_events(completion))
    assert len(chunk["choices"]) == 2


def test_what_is_not_a_completion_goes_out_as_one_event() -> None:
    error = {"error": {"message": "overloaded", "type": "server_error"}}
    assert events(completion_events(error)) == [error]
