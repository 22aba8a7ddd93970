"""Chat ⇄ Gemini (llmgw/translation/gemini.py): pure functions, no network."""

from __future__ import annotations

import pytest

from llmgw.errors import InvalidRequest
from llmgw.translation.gemini import (
    GeminiChunks,
    completion_from_gemini,
    gemini_error_body,
    gemini_request,
    tool_call_id,
)


def test_a_request_keeps_what_gemini_has() -> None:
    call_id = tool_call_id(0, "c2lnbmF0dXJl+/=")
    request = gemini_request(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "D"},
                {"role": "user", "content": [{"type": "text", "text": "u"}]},
                {
                    "role": "assistant",
                    "content": "thinking aloud",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a":1}'},
                        },
                        {
                            "id": "plain",
                            "type": "function",
                            "function": {"name": "g", "arguments": "{}"},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": "r1"},
                {
                    "role": "tool",
                    "tool_call_id": "plain",
                    "content": [{"type": "text", "text": "r2"}],
                },
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "description": "F", "parameters": {"type": "object"}},
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "max_completion_tokens": 9,
            "top_p": 0.5,
            "seed": 3,
            "stop": ["x"],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object"}},
            },
            "reasoning_effort": "medium",
            "n": 2,
        }
    )
    assert request == {
        "contents": [
            {"role": "user", "parts": [{"text": "u"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "thinking aloud"},
                    {
                        "functionCall": {"name": "f", "args": {"a": 1}},
                        "thoughtSignature": "c2lnbmF0dXJl+/=",
                    },
                    {"functionCall": {"name": "g", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "f", "response": {"result": "r1"}}},
                    {"functionResponse": {"name": "g", "response": {"result": "r2"}}},
                ],
            },
        ],
        "systemInstruction": {"parts": [{"text": "D"}]},
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "f", "description": "F", "parametersJsonSchema": {"type": "object"}}
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {
            "maxOutputTokens": 9,
            "topP": 0.5,
            "seed": 3,
            "stopSequences": ["x"],
            "responseMimeType": "application/json",
            "responseJsonSchema": {"type": "object"},
            "thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True},
        },
    }


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
            },
            "messages[0].content[0].image_url.url",
        ),
        ({"role": "tool", "tool_call_id": "nowhere", "content": "r"}, "messages[0].tool_call_id"),
    ],
)
def test_what_gemini_cannot_take_is_refused_naming_it(message: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        gemini_request({"messages": [message]})
    assert refused.value.param == param


def test_an_answer_with_thoughts_a_signed_call_and_usage() -> None:
    completion = completion_from_gemini(
        {
            "candidates": [
                {
                    "content": {
                        "role": "model",
                        "parts": [
                            {"text": "hmm", "thought": True},
                            {
                                "functionCall": {"name": "f", "args": {"a": 1}},
                                "thoughtSignature": "sig",
                            },
                        ],
                    },
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 100,
                "cachedContentTokenCount": 40,
                "candidatesTokenCount": 5,
                "thoughtsTokenCount": 7,
            },
        },
        model="m",
        created=1,
    )
    [choice] = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "hmm"
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert (
        gemini_request({"messages": [{"role": "assistant", "tool_calls": [call]}]})["contents"][0][
            "parts"
        ][0]["thoughtSignature"]
        == "sig"
    )
    assert completion["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 12,
        "total_tokens": 112,
        "prompt_tokens_details": {"cached_tokens": 40},
        "completion_tokens_details": {"reasoning_tokens": 7},
    }


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"candidates": [{"finishReason": "MAX_TOKENS"}]}, "length"),
        ({"candidates": [{"finishReason": "SAFETY"}]}, "content_filter"),
        ({"candidates": [{"finishReason": "RECITATION"}]}, "content_filter"),
        ({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}, "content_filter"),
    ],
)
def test_finish_reasons(answer: dict, reason: str) -> None:
    assert (
        completion_from_gemini(answer, model="m", created=1)["choices"][0]["finish_reason"]
        == reason
    )


def test_chunks_end_with_the_finish_usage_and_done() -> None:
    chunks = GeminiChunks(model="m", created=1, include_usage=True)
    first = chunks.feed({"candidates": [{"content": {"parts": [{"text": "He"}]}}]})
    assert [c["choices"][0]["delta"] for c in first if isinstance(c, dict)] == [
        {"role": "assistant", "content": ""},
        {"content": "He"},
    ]
    assert not chunks.finished
    last = chunks.feed(
        {
            "candidates": [{"content": {"parts": [{"text": "llo"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 2},
        }
    )
    assert last[-1] == b"[DONE]" and chunks.finished
    assert last[-2]["usage"]["total_tokens"] == 4  # type: ignore[index]
    assert last[1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


def test_googles_error_becomes_openais_shape() -> None:
    body = b'{"error": {"code": 429, "message": "Quota exceeded.", "status": "RESOURCE_EXHAUSTED"}}'
    assert gemini_error_body(429, body) == (
        b'{"error":{"message":"Quota exceeded.","type":"RESOURCE_EXHAUSTED","param":null,"code":null}}'
    )
