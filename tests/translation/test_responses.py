"""Golden tests of the Responses ⇄ chat completions translation and its stream state machine.

Each case's expected output is a JSON file under ``golden/responses/``; run with
``LLMGW_UPDATE_GOLDEN=1`` to rewrite them after a deliberate change (and read the diff).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmgw.errors import InvalidRequest, UpstreamUnavailable
from llmgw.translation import responses as translation
from llmgw.translation.responses_stream import ResponsesStreamTranslator
from tests.translation.wrong_types import crashes

GOLDEN = Path(__file__).parent / "golden" / "responses"
UPDATE = os.environ.get("LLMGW_UPDATE_GOLDEN") == "1"


def fixed_ids() -> translation.ResponseIds:
    counter = itertools.count(1)
    return translation.ResponseIds(
        lambda prefix: f"{prefix}_{next(counter)}", lambda: 1_700_000_000
    )


def check_golden(name: str, value: Any) -> None:
    path = GOLDEN / f"{name}.json"
    rendered = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rendered)
    assert path.exists(), f"no golden file {path}; run with LLMGW_UPDATE_GOLDEN=1"
    assert orjson.loads(path.read_bytes()) == orjson.loads(rendered)


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather by city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}
# What Codex offers: functions, a namespace of them, and hosted tools chat cannot offer.
AGENTS_NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "close_agent",
            "description": "Close an agent.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"target": {"type": "string"}}},
        },
        {"type": "custom", "name": "note", "description": "Free text."},
        {"type": "web_search"},
    ],
}
CODEX_TOOLS = [
    WEATHER_TOOL,
    AGENTS_NAMESPACE,
    {"type": "web_search", "external_web_access": False},
    {"type": "local_shell"},
    {"type": "image_generation"},
]

REQUESTS: dict[str, dict[str, Any]] = {
    "string_input": {"model": "m", "input": "Hello", "instructions": "Be brief."},
    "every_input_item": {
        "model": "m",
        "instructions": "You are terse.",
        "input": [
            {"role": "developer", "content": "Answer in English."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is in this image, and the weather?"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AAAA",
                        "detail": "low",
                    },
                    {
                        "type": "input_file",
                        "file_data": "data:text/plain;base64,aGk=",
                        "filename": "a.txt",
                    },
                ],
            },
            {
                "type": "reasoning",
                "id": "rs_0",
                "summary": [{"type": "summary_text", "text": "hm"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
            },
            {
                "type": "function_call",
                "call_id": "call_a",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "call_b",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
            },
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "call_b",
                "output": [{"type": "input_text", "text": "rain"}],
            },
            {
                "type": "custom_tool_call",
                "call_id": "call_c",
                "name": "apply_patch",
                "input": "*** Begin Patch",
            },
            {"type": "custom_tool_call_output", "call_id": "call_c", "output": "done"},
        ],
        "tools": [WEATHER_TOOL, PATCH_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 256,
        "temperature": 0.2,
        "top_p": 0.9,
        "parallel_tool_calls": False,
        "user": "u-1",
        "text": {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": {"type": "object"},
                "strict": True,
            },
            "verbosity": "low",
        },
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": True,
        "include": ["reasoning.encrypted_content"],
        "truncation": "auto",
        "metadata": {"k": "v"},
        "stream": True,
    },
    "codex_tools_and_namespaced_history": {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": "Close agent a1."},
            {
                "type": "function_call",
                "call_id": "call_n",
                "name": "close_agent",
                "namespace": "multi_agent_v1",
                "arguments": '{"target":"a1"}',
            },
            {"type": "function_call_output", "call_id": "call_n", "output": "closed"},
            {
                "type": "custom_tool_call",
                "call_id": "call_m",
                "name": "note",
                "namespace": "multi_agent_v1",
                "input": "done",
            },
            {"type": "custom_tool_call_output", "call_id": "call_m", "output": "noted"},
        ],
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "stream": True,
    },
    "json_object_and_allowed_tools": {
        "model": "m",
        "input": [{"role": "user", "content": "json please"}],
        "text": {"format": {"type": "json_object"}},
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []},
    },
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_to_chat(name: str) -> None:
    check_golden(f"request_{name}", translation.to_chat(REQUESTS[name]))


def test_request_continues_the_stored_history_without_old_instructions() -> None:
    history = [
        {"type": "message", "role": "user", "content": "4 + 6?"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "add",
            "arguments": "{}",
        },
    ]
    body = {
        "model": "m",
        "instructions": "New instructions.",
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "10"}],
    }
    check_golden("request_with_history", translation.to_chat(body, history))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": "x", "tools": [{"name": "no_type"}]}, "tools[0]"),
        (
            {"model": "m", "input": "x", "tools": [WEATHER_TOOL, {**WEATHER_TOOL}]},
            "tools[1]",
        ),
        (
            {"model": "m", "input": "x", "tools": [{"type": "namespace", "name": "n"}]},
            "tools[0]",
        ),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"model": "m", "input": [{"type": "local_shell_call"}]}, "input[0]"),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
            },
            "input[0].content[0]",
        ),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}],
            },
            "input[0].content[0]",
        ),
        ({"model": "m", "input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ],
)
def test_what_chat_cannot_express_is_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        translation.to_chat(body)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": [1]}, "input[0]"),
        ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "x", "background": True}, "background"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": "x", "previous_response_id": 7}, "previous_response_id"),
    ],
)
def test_validation(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        translation.validate_request(body)
    assert caught.value.param == param


def test_tools_chat_cannot_offer_are_left_out_and_named() -> None:
    tools = translation.chat_tools(CODEX_TOOLS)
    assert tools.omitted == ("web_search", "local_shell", "image_generation")
    assert [function["function"]["name"] for function in tools.functions] == [
        "get_weather",
        "multi_agent_v1__close_agent",
        "multi_agent_v1__note",
    ]
    # With nothing left to offer, neither tools nor a tool_choice (strict providers refuse it).
    chat = translation.to_chat(
        {"model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": "auto"}
    )
    assert "tools" not in chat and "tool_choice" not in chat


def test_native_request_folds_in_history_and_instructions_in_venice_shapes() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": "again",
        "tools": [WEATHER_TOOL, {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "store": True,
        "previous_response_id": "resp_1",
        "text": {"format": {"type": "text"}},
        "metadata": {"a": "b"},
        "max_output_tokens": 10,
        "stream": True,
    }
    history = [{"type": "message", "role": "user", "content": "first"}]
    check_golden("native_request", translation.native_request(body, history))


AZURE_SAFE = {"filtered": False, "severity": "safe"}
AZURE_NOT_DETECTED = {"filtered": False, "detected": False}
COMPLETIONS: dict[str, dict[str, Any]] = {
    "text": {
        "id": "chatcmpl-1",
        "created": 1_700_000_001,
        "model": "m-2026",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hi!"},
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    },
    "reasoning_and_tool_calls": {
        "id": "chatcmpl-2",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Checking.",
                    "reasoning_content": "The user wants weather.",
                    "tool_calls": [
                        {
                            "id": "call_x",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                        },
                        {
                            "id": "call_y",
                            "type": "function",
                            "function": {
                                "name": "apply_patch",
                                "arguments": '{"input":"*** Begin"}',
                            },
                        },
                    ],
                },
            }
        ],
        "usage": {
            "prompt_tokens": 30,
            "completion_tokens": 20,
            "total_tokens": 50,
            "completion_tokens_details": {"reasoning_tokens": 8},
        },
    },
    "length": {
        "id": "chatcmpl-3",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": "Once upon"},
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    },
    # Azure's (shared/azure-openai.md Z5): filter verdicts on the prompt and the choice, the
    # answer cut by its output filter, and the model's name rather than the deployment's.
    "azure_output_filtered": {
        "id": "chatcmpl-BD5yZBfhSLLcuDtRtF48KwOywtED5",
        "object": "chat.completion",
        "created": 1_742_460_935,
        "model": "gpt-4o-2024-11-20",
        "system_fingerprint": "fp_ded0d14823",
        "prompt_filter_results": [
            {"prompt_index": 0, "content_filter_results": {"jailbreak": AZURE_NOT_DETECTED}}
        ],
        "choices": [
            {
                "index": 0,
                "finish_reason": "content_filter",
                "logprobs": None,
                "content_filter_results": {
                    "hate": AZURE_SAFE,
                    "violence": {"filtered": True, "severity": "high"},
                },
                "message": {"role": "assistant", "content": None, "refusal": None},
            }
        ],
        "usage": {"prompt_tokens": 14, "completion_tokens": 0, "total_tokens": 14},
    },
    "content_filter": {
        "id": "chatcmpl-4",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "content_filter",
                "message": {"role": "assistant", "content": ""},
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5},
    },
}
RESPONSE_REQUEST = {
    "model": "m",
    "input": "x",
    "instructions": "Be brief.",
    "tools": [WEATHER_TOOL, PATCH_TOOL],
    "metadata": {"k": "v"},
    "previous_response_id": "resp_0",
}


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_completion_to_response(name: str) -> None:
    response = translation.from_chat(
        COMPLETIONS[name], request=RESPONSE_REQUEST, response_id="resp_test", ids=fixed_ids()
    )
    check_golden(f"response_{name}", response)


# Streams ---------------------------------------------------------------------------------------


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "model": "m-2026",
        "choices": choices,
        **extra,
    }


def azure_chunk(
    delta: dict[str, Any], finish: str | None, results: dict[str, Any]
) -> dict[str, Any]:
    """A chunk as Azure sends it: each choice with its filter verdicts and ``logprobs``."""
    streamed = chunk(delta, finish)
    streamed["choices"][0] |= {"content_filter_results": results, "logprobs": None}
    return streamed


def parse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        event_line, data_line = frame.split("\n")
        payload = orjson.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {payload['type']}"
        events.append(payload)
    return events


USAGE = {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
STREAMS: dict[str, list[dict[str, Any]]] = {
    "text": [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        chunk(None, usage=USAGE),
    ],
    "reasoning_text_and_tool_calls": [
        chunk({"role": "assistant", "reasoning_content": "Think"}),
        chunk({"reasoning_content": "ing."}),
        chunk({"content": "Calling."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "apply_patch", "arguments": '{"input":"*** Begin"}'},
                    }
                ]
            }
        ),
        chunk({}, "tool_calls", usage=USAGE),
    ],
    # Azure's (shared/azure-openai.md Z11): a first chunk with no choices and a blank identity
    # holding the prompt's verdicts, verdicts on every choice, usage after the finish.
    "azure_filter_results": [
        {
            "choices": [],
            "created": 0,
            "id": "",
            "model": "",
            "object": "",
            "prompt_filter_results": [
                {"prompt_index": 0, "content_filter_results": {"jailbreak": AZURE_NOT_DETECTED}}
            ],
        },
        azure_chunk({"role": "assistant", "content": "", "refusal": None}, None, {}),
        azure_chunk({"content": "Par"}, None, {"hate": AZURE_SAFE}),
        azure_chunk({"content": "is"}, None, {"hate": AZURE_SAFE}),
        azure_chunk({}, "stop", {}),
        chunk(None, usage=USAGE),
    ],
    "length_without_usage": [
        chunk({"role": "assistant", "content": "Once"}),
        chunk({}, "length"),
    ],
}


@pytest.mark.parametrize("name", sorted(STREAMS))
async def test_stream_events(name: str) -> None:
    translator = ResponsesStreamTranslator(
        RESPONSE_REQUEST, response_id="resp_s", ids=fixed_ids(), estimated_input_tokens=11
    )
    raw = (
        translator.start()
        + b"".join(translator.feed(c) for c in STREAMS[name])
        + await translator.finish()
    )
    events = parse_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert translator.response == final
    # Every item the final response holds was announced complete by its output_item.done.
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert final["output"] == done
    check_golden(f"stream_{name}", events)


def test_stream_error_closes_the_open_item_then_fails() -> None:
    translator = ResponsesStreamTranslator(RESPONSE_REQUEST, response_id="resp_e", ids=fixed_ids())
    raw = translator.start() + translator.feed(chunk({"content": "Par"}))
    raw += translator.error(
        UpstreamUnavailable("The provider broke off.", code="upstream_stream_interrupted")
    )
    events = parse_events(raw)
    check_golden("stream_error", events)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-1]["response"]["error"] == {
        "code": "server_error",
        "message": "The provider broke off.",
    }


NAMESPACED_CALLS = [
    {
        "id": "call_n",
        "type": "function",
        "function": {"name": "multi_agent_v1__close_agent", "arguments": '{"target":"a1"}'},
    },
    {
        "id": "call_m",
        "type": "function",
        "function": {"name": "multi_agent_v1__note", "arguments": '{"input":"done"}'},
    },
]
NAMESPACED_ITEMS = [
    {
        "type": "function_call",
        "call_id": "call_n",
        "name": "close_agent",
        "namespace": "multi_agent_v1",
        "arguments": '{"target":"a1"}',
        "status": "completed",
    },
    {
        "type": "custom_tool_call",
        "call_id": "call_m",
        "name": "note",
        "namespace": "multi_agent_v1",
        "input": "done",
        "status": "completed",
    },
]


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


async def test_a_namespaced_call_comes_back_with_its_name_and_namespace() -> None:
    """As the Responses API returns it, and as Codex dispatches it (on name and namespace)."""
    request = {"model": "m", "input": "x", "tools": CODEX_TOOLS}
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": NAMESPACED_CALLS},
            }
        ]
    }
    response = translation.from_chat(
        completion, request=request, response_id="resp_n", ids=fixed_ids()
    )
    assert without_ids(response["output"]) == NAMESPACED_ITEMS

    translator = ResponsesStreamTranslator(request, response_id="resp_n", ids=fixed_ids())
    calls = [{**call, "index": index} for index, call in enumerate(NAMESPACED_CALLS)]
    raw = translator.start() + translator.feed(chunk({"tool_calls": calls}, "tool_calls"))
    raw += await translator.finish()
    done = [e["item"] for e in parse_events(raw) if e["type"] == "response.output_item.done"]
    assert without_ids(done) == NAMESPACED_ITEMS
    # Sent back as history, they are the calls the chat model made.
    chat = translation.to_chat({**request, "input": NAMESPACED_ITEMS})
    assert [call["function"] for call in chat["messages"][0]["tool_calls"]] == [
        call["function"] for call in NAMESPACED_CALLS
    ]


# ---------------------------------------------------------------------------------------------
# Hostile or broken provider answers: never a nameless tool call, never a negative count, never
# a crash whatever the JSON types.


def run_stream(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    translator = ResponsesStreamTranslator(
        RESPONSE_REQUEST, response_id="resp_h", ids=fixed_ids(), estimated_input_tokens=11
    )
    raw = translator.start()
    try:
        raw += b"".join(translator.feed(c) for c in chunks)
        raw += asyncio.run(translator.finish())
    except UpstreamUnavailable as error:
        raw += translator.error(error)
    return parse_events(raw)


@pytest.mark.parametrize("function", [{"name": ""}, {}, {"name": None}, {"name": ["x"]}])
def test_a_tool_call_naming_no_tool_is_the_providers_failure(function: dict[str, Any]) -> None:
    call = {"id": "call_1", "type": "function", "function": {**function, "arguments": "{}"}}
    completion = {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}
    with pytest.raises(UpstreamUnavailable) as whole:
        translation.from_chat(
            completion, request=RESPONSE_REQUEST, response_id="resp_h", ids=fixed_ids()
        )
    assert whole.value.code == "upstream_invalid_response"
    events = run_stream(
        [chunk({"content": "Let me"}), chunk({"tool_calls": [{"index": 0, **call}]})]
    )
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "upstream_invalid_response"
    assert all(e.get("item", {}).get("type") != "function_call" for e in events)


@pytest.mark.parametrize("bad", [-5, 2.5, "7", True, 2**40])
def test_a_count_that_is_no_count_is_unreported_never_negative(bad: Any) -> None:
    def response(usage: dict[str, Any]) -> dict[str, Any]:
        completion = {"choices": [{"message": {"content": "Hi"}}], "usage": usage}
        return translation.from_chat(
            completion, request=RESPONSE_REQUEST, response_id="resp_h", ids=fixed_ids()
        )

    # Neither count usable: as if no usage came (none in a whole answer, the estimate in a stream).
    usage = {"prompt_tokens": bad, "completion_tokens": bad, "total_tokens": bad}
    assert response(usage)["usage"] is None
    final = run_stream([chunk({"content": "Hi"}, "stop"), chunk(usage=usage)])[-1]["response"]
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (11, 0)
    # One count usable: the other is 0, the total their sum, the details never negative.
    partial = {
        "prompt_tokens": 10,
        "completion_tokens": bad,
        "total_tokens": -1,
        "prompt_tokens_details": {"cached_tokens": bad},
        "completion_tokens_details": {"reasoning_tokens": bad},
    }
    assert response(partial)["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 10,
    }


def test_an_answer_with_a_wrong_type_anywhere_is_translated_or_refused() -> None:
    def translate(completion: Any) -> None:
        if isinstance(completion, dict):
            response = translation.from_chat(
                completion, request=RESPONSE_REQUEST, response_id="resp_h", ids=fixed_ids()
            )
            orjson.dumps(response)

    found = [
        f"{name}: {crash}"
        for name, completion in COMPLETIONS.items()
        for crash in crashes(completion, translate, (UpstreamUnavailable,))
    ]
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_a_stream_with_a_wrong_type_anywhere_is_translated_or_ends_in_an_error() -> None:
    def play(chunks: Any) -> None:
        if isinstance(chunks, list):
            run_stream([c for c in chunks if isinstance(c, dict)])

    found = [
        f"{name}: {crash}" for name, chunks in STREAMS.items() for crash in crashes(chunks, play)
    ]
    assert not found, "\n".join(found)
