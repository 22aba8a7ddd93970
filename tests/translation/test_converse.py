"""Messages ⇄ Converse (llmgw/translation/converse.py): pure functions, no network."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from llmgw.errors import InvalidRequest
from llmgw.translation.converse import ConverseEvents, converse_request, message_from_converse

PDF = base64.b64encode(b"%PDF-1.7 fake").decode()


def test_a_full_request_keeps_every_field_converse_has() -> None:
    request = converse_request(
        {
            "model": "m",
            "max_tokens": 100,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["END"],
            "stream": True,
            "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [
                {"name": "t", "description": "d", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search"},
            ],
            "tool_choice": {"type": "tool", "name": "t"},
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                        {
                            "type": "document",
                            "title": "Q3 report: final/v2",
                            "source": {
                                "type": "base64",
                                "media_type": "application/pdf",
                                "data": PDF,
                            },
                        },
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "plain"},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "b64=="},
                        {"type": "tool_use", "id": "tu1", "name": "t", "input": {"a": 1}},
                        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "tu1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "failed"}],
                        }
                    ],
                },
            ],
        }
    )
    cache = {"cachePoint": {"type": "default"}}
    assert request == {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"text": "look"},
                    cache,
                    {
                        "document": {
                            "format": "pdf",
                            "name": "Q3 report final v2",
                            "source": {"bytes": PDF},
                        }
                    },
                    {
                        "document": {
                            "format": "txt",
                            "name": "document",
                            "source": {"bytes": base64.b64encode(b"plain").decode()},
                        }
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}},
                    {"reasoningContent": {"redactedContent": "b64=="}},
                    {"toolUse": {"toolUseId": "tu1", "name": "t", "input": {"a": 1}}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": "tu1",
                            "content": [{"text": "failed"}],
                            "status": "error",
                        }
                    }
                ],
            },
        ],
        "system": [{"text": "S"}, cache],
        "inferenceConfig": {
            "maxTokens": 100,
            "temperature": 0.5,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "t",
                        "inputSchema": {"json": {"type": "object"}},
                        "description": "d",
                    }
                }
            ],
            "toolChoice": {"tool": {"name": "t"}},
        },
        "additionalModelRequestFields": {
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "top_k": 40,
        },
    }


def test_tools_used_in_history_but_not_offered_are_declared_again() -> None:
    request = converse_request(
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "w", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "a", "content": "ok"}],
                },
            ]
        }
    )
    assert request["toolConfig"] == {
        "tools": [{"toolSpec": {"name": "w", "inputSchema": {"json": {"type": "object"}}}}]
    }


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ({"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}, "base64"),
        (
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="},
            },
            "png, jpeg, gif or webp",
        ),
        (
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "video/mp4", "data": "AA=="},
            },
            "no documents of type",
        ),
    ],
)
def test_what_converse_cannot_take_is_refused_naming_the_field(
    block: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        converse_request({"messages": [{"role": "user", "content": [block]}]})
    assert says in refused.value.message
    assert refused.value.param is not None and refused.value.param.startswith(
        "messages[0].content[0]"
    )


def test_an_answer_becomes_a_messages_answer() -> None:
    message = message_from_converse(
        {
            "output": {
                "message": {
                    "role": "assistant",
                    "content": [
                        {"reasoningContent": {"reasoningText": {"text": "r", "signature": "s"}}},
                        {"text": "hello"},
                        {"toolUse": {"toolUseId": "x", "name": "t", "input": {"k": "v"}}},
                    ],
                }
            },
            "stopReason": "guardrail_intervened",
            "usage": {
                "inputTokens": 10,
                "outputTokens": 5,
                "totalTokens": 45,
                "cacheReadInputTokens": 20,
                "cacheWriteInputTokens": 10,
            },
        },
        model="m",
    )
    assert message["content"] == [
        {"type": "thinking", "thinking": "r", "signature": "s"},
        {"type": "text", "text": "hello"},
        {"type": "tool_use", "id": "x", "name": "t", "input": {"k": "v"}},
    ]
    assert message["stop_reason"] == "refusal"
    assert message["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 20,
        "cache_creation_input_tokens": 10,
    }


def test_stream_events_become_messages_events_with_usage_after_the_stop() -> None:
    events = ConverseEvents(model="m")
    fed = [
        ("messageStart", {"role": "assistant"}),
        (
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "r"}}},
        ),
        (
            "contentBlockDelta",
            {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "s"}}},
        ),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "hi"}}),
        ("contentBlockStop", {"contentBlockIndex": 1}),
        (
            "contentBlockStart",
            {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "x", "name": "t"}}},
        ),
        ("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"toolUse": {"input": '{"k"'}}}),
        ("contentBlockStop", {"contentBlockIndex": 2}),
        ("messageStop", {"stopReason": "tool_use"}),
    ]
    out = [e for kind, event in fed for e in events.feed(kind, event)]
    assert [e["type"] for e in out] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert out[1]["content_block"]["type"] == "thinking"
    assert out[3]["delta"] == {"type": "signature_delta", "signature": "s"}
    assert out[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"k"'}
    assert not events.finished
    last = events.feed("metadata", {"usage": {"inputTokens": 3, "outputTokens": 4}})
    assert last[0]["delta"]["stop_reason"] == "tool_use"
    assert last[0]["usage"]["output_tokens"] == 4
    assert last[1] == {"type": "message_stop"}
    assert events.finished and events.finish() == []


def test_a_stream_stopped_without_metadata_still_ends_and_one_not_stopped_does_not() -> None:
    events = ConverseEvents(model="m")
    events.feed("messageStart", {"role": "assistant"})
    assert events.finish() == [] and not events.finished
    events.feed("messageStop", {"stopReason": "end_turn"})
    assert [e["type"] for e in events.finish()] == ["message_delta", "message_stop"]
