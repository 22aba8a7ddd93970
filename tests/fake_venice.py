"""A fake Venice AI upstream: a real aiohttp server on 127.0.0.1 that answers like Venice.

Shapes, headers and error bodies follow ``shared/venice-api.md`` and the recorded cassettes.
Tests script failures per request with :class:`Behaviour`; the benchmark runs it standalone
(``python tests/fake_venice.py --port 8099``), so the hot path avoids logging, sleeps that
nobody asked for, and repeated work.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any, Literal

import attrs
import orjson
from aiohttp import web

FAKE_VENICE_KEY: str = "venice-fake-provider-key-7f3a9c"

VENICE_VERSION = "20260821.193530"
TOOL_ARGUMENTS = '{"a": 4, "b": 6}'
DEFAULT_EMBEDDING_DIMENSIONS = 8

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"

UsagePlacement = Literal["separate", "finish"]
_UsageMode = Literal["separate", "finish", "none"]
_Cut = Literal["drop", "error", "stall", "end"]


def expected_cost_usd(prompt_tokens: int, completion_tokens: int) -> float:
    """The `cost.usd` the fake reports; output is priced high so sums stay visible in tests."""
    return round(prompt_tokens * 0.1e-6 + completion_tokens * 0.15e-3, 10)


def count_prompt_tokens(messages: Any) -> int:
    """Whitespace-separated words over all message contents (strings and text parts), min 1."""
    words = 0
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                words += _count_words(message.get("content"))
    return max(1, words)


def _count_words(content: Any) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(
            len(part["text"].split())
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def split_reply(text: str, chunks: int) -> list[str]:
    """Split by characters (not bytes or words) into `chunks` near-equal, possibly empty pieces.

    Character splitting puts multi-byte UTF-8 characters next to chunk borders, which is
    exactly what a gateway's SSE re-framing must survive.
    """
    count = max(1, chunks)
    size, extra = divmod(len(text), count)
    pieces: list[str] = []
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


# ---------------------------------------------------------------------------------------------
# Error bodies (venice-api.md A4)

_STATUS_MESSAGES: dict[int, str] = {
    400: "Invalid request parameters",
    401: "Authentication failed",
    402: (
        "Insufficient USD or Diem balance to complete request. "
        "Visit https://venice.ai/settings/api to add credits."
    ),
    403: "Unauthorized access",
    415: "Invalid request content-type",
    422: "Your prompt violates the content policy of Venice.ai or the model provider",
    429: "Rate limit exceeded",
    500: "Inference processing failed",
    503: "The model is at capacity. Please try again later.",
    504: (
        "The request took too long to complete and was timed-out. "
        "For long running requests, use the streaming API by setting stream=true."
    ),
}


def model_not_found_body(model: str) -> bytes:
    return orjson.dumps(
        {
            "error": f"Specified model not found: {model}. "
            "Did you mean: venice-uncensored-1-2, venice-uncensored-role-play?"
        }
    )


def venice_error_body(status: int, model: str = "") -> bytes:
    """The body Venice sends for `status`; unknown statuses fall back to the HTTP reason."""
    if status == 404:
        return model_not_found_body(model)
    if status == 413:
        return orjson.dumps({"code": "PAYLOAD_TOO_LARGE", "error": "Request payload too large"})
    message = _STATUS_MESSAGES.get(status)
    if message is None:
        try:
            message = HTTPStatus(status).phrase
        except ValueError:
            message = "Error"
    return orjson.dumps({"error": message})


def detailed_error_body(field: str | None, message: str, code: str) -> bytes:
    """Venice's zod-style DetailedError: `details` is the `_errors` tree, `issues` the flat list."""
    details: dict[str, Any] = {"_errors": [] if field else [message]}
    if field:
        details[field] = {"_errors": [message]}
    issue = {"code": code, "message": message, "path": [field] if field else []}
    return orjson.dumps({"details": details, "error": _STATUS_MESSAGES[400], "issues": [issue]})


def unsupported_parameter_body(name: str) -> bytes:
    """How an OpenAI-compatible upstream refuses a parameter it does not take (OpenAI's own 400;
    shared/provider-failures.md F1), as LiteLLM refused Claude Code's reasoning_effort."""
    error = {
        "message": f"Unsupported parameter: '{name}' is not supported with this model.",
        "type": "invalid_request_error",
        "param": name,
        "code": "unsupported_parameter",
    }
    return orjson.dumps({"error": error})


_INVALID_JSON_BODY = orjson.dumps({"error": "Invalid JSON request"})
_MODEL_REQUIRED_BODY = orjson.dumps({"error": "model is required"})
_AUTH_FAILED_BODY = orjson.dumps({"error": "Authentication failed"})
_ROUTE_NOT_FOUND_BODY = orjson.dumps({"error": "Not found"})
_X402_BODY = orjson.dumps(
    {
        "x402Version": 2,
        "error": "Authentication required",
        "accepts": [
            {
                "scheme": "exact",
                "network": "base",
                "maxAmountRequired": "10000",
                "resource": "https://api.venice.ai/api/v1/chat/completions",
                "description": "Venice AI inference",
                "mimeType": "application/json",
                "payTo": "0x0000000000000000000000000000000000000000",
                "asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
            }
        ],
        "authOptions": [
            {"type": "bearer", "header": "Authorization"},
            {"type": "x402", "header": "SIGN-IN-WITH-X"},
        ],
    }
)
_GARBAGE_BODY = b"<html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>"
_GARBAGE_EVENT = b'data: {"choices": [{"delta": not json at all\n\n'
_MID_STREAM_ERROR_EVENT = (
    b"data: "
    + orjson.dumps(
        {
            "error": {
                "message": "The model is currently overloaded.",
                "type": "server_error",
                "code": "model_overloaded",
                "param": None,
                "retry_after": 30,
            }
        }
    )
    + b"\n\n"
)
_DONE_EVENT = b"data: [DONE]\n\n"


# ---------------------------------------------------------------------------------------------
# Models (trimmed from the recorded list_models cassette)


def _model_item(
    model_id: str, name: str, context: int, max_completion: int, price: tuple[float, float]
) -> dict[str, Any]:
    is_embedding = model_id.startswith("text-embedding")
    return {
        "context_length": context,
        "created": 1727966436,
        "id": model_id,
        "model_spec": {
            "availableContextTokens": context,
            "capabilities": {
                "optimizedForCode": False,
                "quantization": "fp8",
                "supportsFunctionCalling": not is_embedding,
                "supportsLogProbs": False,
                "supportsReasoning": model_id.startswith("qwen"),
                "supportsResponseSchema": True,
                "supportsVision": False,
                "supportsWebSearch": not is_embedding,
            },
            "description": f"{name} (fake Venice).",
            "maxCompletionTokens": max_completion,
            "name": name,
            "offline": False,
            "pricing": {
                "input": {"diem": price[0], "usd": price[0]},
                "output": {"diem": price[1], "usd": price[1]},
            },
            "privacy": "private",
            "traits": ["most_uncensored"] if model_id == "venice-uncensored-1-2" else [],
        },
        "object": "model",
        "owned_by": "venice.ai",
        "type": "embedding" if is_embedding else "text",
    }


MODELS: list[dict[str, Any]] = [
    # Output priced as the fake bills it (expected_cost_usd), so the price table agrees with it.
    _model_item("qwen3-5-9b", "Qwen 3.5 9B", 256000, 32768, (0.1, 150.0)),
    _model_item("llama-3.3-70b", "Llama 3.3 70B", 128000, 4096, (0.7, 2.8)),
    _model_item(
        "mistral-small-3-2-24b-instruct",
        "Mistral Small 3.2 24B Instruct",
        256000,
        16384,
        (0.09375, 0.25),
    ),
    _model_item("venice-uncensored-1-2", "Venice Uncensored 1.2", 128000, 8192, (0.2, 0.9)),
    _model_item("text-embedding-qwen3-0-6b", "Qwen3 Embedding 0.6B", 32768, 0, (0.02, 0.0)),
]
_MODEL_NAMES = {item["id"]: item["model_spec"]["name"] for item in MODELS}
_MODEL_TYPES = frozenset(
    {"asr", "embedding", "image", "music", "text", "tts", "upscale", "inpaint", "video", "all", "code"}
)  # fmt: skip


def _model_list_body(model_type: str) -> bytes:
    data = [item for item in MODELS if model_type == "all" or item["type"] == model_type]
    return orjson.dumps({"data": data, "object": "list", "type": model_type})


_MODEL_LIST_BODIES = {model_type: _model_list_body(model_type) for model_type in _MODEL_TYPES}


# ---------------------------------------------------------------------------------------------
# Request checks; each returns (status, body) for a rejection or None


_NOT_JSON: Any = object()

_VENICE_PARAMETER_DEFAULTS: dict[str, Any] = {
    "disable_thinking": False,
    "enable_e2ee": True,
    "enable_web_citations": False,
    "enable_web_scraping": False,
    "enable_web_search": "off",
    "enable_x_search": False,
    "include_search_results_in_stream": False,
    "include_venice_system_prompt": True,
    "return_search_results_as_documents": False,
    "strip_thinking_response": False,
}
_ECHOED_VENICE_PARAMETERS = frozenset(_VENICE_PARAMETER_DEFAULTS) | {"character_slug"}

CHAT_FIELDS = frozenset(
    {
        "model", "messages", "venice_parameters",
        "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs",
        "max_tokens", "max_completion_tokens", "n", "seed", "stop", "stream",
        "stream_options", "temperature", "top_p", "tools", "tool_choice",
        "parallel_tool_calls", "response_format", "reasoning_effort", "reasoning",
        "prompt_cache_key", "prompt_cache_retention", "verbosity", "text",
        "user", "store", "metadata", "include",
        "top_k", "min_p", "min_temp", "max_temp", "repetition_penalty",
        "stop_token_ids", "anon_user_id", "fallbacks",
    }
)  # fmt: skip

_Rejection = tuple[int, bytes]


def _auth_rejection(authorization: str | None) -> _Rejection | None:
    # Venice answers a missing key with x402 payment discovery, not a 401.
    if authorization is None:
        return 402, _X402_BODY
    if authorization != f"Bearer {FAKE_VENICE_KEY}":
        return 401, _AUTH_FAILED_BODY
    return None


def _body_rejection(body: Any) -> _Rejection | None:
    if body is _NOT_JSON:
        return 400, _INVALID_JSON_BODY
    if not isinstance(body, dict):
        return 400, detailed_error_body(None, "Expected object", "invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return 400, _MODEL_REQUIRED_BODY
    return None


def _chat_rejection(
    body: Any, strict_fields: bool, refused_params: frozenset[str]
) -> _Rejection | None:
    rejection = _body_rejection(body)
    if rejection is not None:
        return rejection
    if refused := sorted(body.keys() & refused_params):
        return 400, unsupported_parameter_body(refused[0])
    if strict_fields and (unknown := sorted(body.keys() - CHAT_FIELDS)):
        keys = ", ".join(f"'{key}'" for key in unknown)
        message = f"Unrecognized key(s) in object: {keys}"
        return 400, detailed_error_body(None, message, "unrecognized_keys")
    if not isinstance(body.get("messages"), list):
        return 400, detailed_error_body("messages", "Required", "invalid_type")
    return _tools_rejection(body.get("tools")) or _model_rejection(body["model"])


# The tools chat completions take ([SW] ChatCompletionRequest.tools): functions in the nested chat
# shape, and Venice's own web_search and x_search. Any other kind (a Responses namespace, a
# flat function) is refused, as every chat-only server does.
_CHAT_TOOL_TYPES = frozenset({"web_search", "x_search"})


def _tools_rejection(tools: Any) -> _Rejection | None:
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        function = tool.get("function") if isinstance(tool, dict) else None
        named = isinstance(function, dict) and isinstance(function.get("name"), str)
        if kind in _CHAT_TOOL_TYPES or (kind == "function" and named):
            continue
        message = f"tools[{index}]: tool type {kind!r} is not supported"
        return 400, detailed_error_body("tools", message, "invalid_union")
    return None


def _embeddings_rejection(body: Any) -> _Rejection | None:
    rejection = _body_rejection(body)
    if rejection is not None:
        return rejection
    inputs = body.get("input")
    if not (
        isinstance(inputs, str)
        or (isinstance(inputs, list) and inputs and all(isinstance(i, str) for i in inputs))
    ):
        return 400, detailed_error_body(
            "input", "Expected string or array of strings", "invalid_type"
        )
    dimensions = body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        return 400, detailed_error_body("dimensions", "Expected positive integer", "invalid_type")
    return _model_rejection(body["model"])


def _model_rejection(model: str) -> _Rejection | None:
    # "contains" rather than "starts with" so the recorded `venice-nonexistent-rig-test` works too.
    if "nonexistent" in model:
        return 404, model_not_found_body(model)
    return None


# ---------------------------------------------------------------------------------------------
# Answers


@attrs.define
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    json: Any
    at: float = attrs.field(factory=time.monotonic)  # when it arrived (for retry spacing)


@attrs.define
class Behaviour:
    """How the fake answers one chat/embeddings request; the defaults answer normally."""

    status: int = 200
    error_body: bytes | None = None
    retry_after: str | None = None
    ratelimit_reset_ms: int | None = None
    delay_before_headers: float = 0.0
    reset_before_headers: bool = False  # the connection closes before any answer byte
    first_event_delay: float = 0.0  # a stream's headers at once, its first event this much later
    rate_limit_headers: bool = True  # False: no x-ratelimit-reset-* (most non-Venice servers)
    chunk_delay: float = 0.0
    drop_after_chunks: int | None = None
    error_event_after_chunks: int | None = None
    garbage: bool = False
    close_mid_body: bool = False
    stall_after_chunks: int | None = None
    end_after_chunks: int | None = None  # the stream closes cleanly there: no finish, no [DONE]
    # A hostile or buggy upstream: `billing` replaces the answer's `usage` and `cost` (the JSON
    # body's, or the usage chunk's), `response_id` its `id`.
    billing: dict[str, Any] | None = None
    response_id: str | None = None
    # The tool call (when tools are offered) names no tool: "empty" sends "name": "", "missing"
    # leaves the field out, as buggy backends and proxies have.
    nameless_tool_call: Literal["empty", "missing"] | None = None
    # Stream framing other OpenAI-compatible servers use (the defaults are Venice's own).
    line_ending: bytes = b"\n"  # b"\r\n" or a bare b"\r" are valid SSE too
    data_space: bool = True  # False: "data:{...}", no space after the colon
    spaced_json: bool = False  # Python's json.dumps default (", " and ": "), e.g. LiteLLM
    split_line_ends: bool = False  # each event in two writes: the last byte comes a little later
    # Stream endings and shapes.
    omit_done: bool = False  # the stream closes cleanly after its last chunk, without [DONE]
    pause_before_usage: float = 0.0  # seconds between the finish chunk and what follows it
    json_answer: bool = False  # "stream": true answered with the whole JSON completion
    oversized_event_bytes: int | None = None  # after the first chunk, one event that never ends
    endless: bool = False  # content chunks every chunk_delay (or 50 ms) until the client leaves
    garbage_after_chunks: int | None = None  # one event that is not JSON there; the stream goes on
    reply: str | None = None  # this answer's text instead of the fake's reply
    # The stream waits for `hold` to be set before its content chunk `held_at`: a test sees what
    # happens while the answer is still coming, for as long as it needs.
    hold: asyncio.Event | None = None
    held_at: int = 0

    @property
    def reframes(self) -> bool:
        return self.line_ending != b"\n" or not self.data_space or self.spaced_json

    def frame(self, event: bytes) -> bytes:
        """One of the fake's own events (``data: <payload>\n\n``) in this framing."""
        payload = event[len(b"data: ") : -2]
        if self.spaced_json and payload != b"[DONE]":
            payload = json.dumps(orjson.loads(payload)).encode()
        prefix = b"data: " if self.data_space else b"data:"
        return prefix + payload + self.line_ending * 2

    def stream_cut(self) -> tuple[int, _Cut] | None:
        """Where and how a stream stops early; the earliest one wins if several are set."""
        candidates: tuple[tuple[int | None, _Cut], ...] = (
            (self.drop_after_chunks, "drop"),
            (self.error_event_after_chunks, "error"),
            (self.stall_after_chunks, "stall"),
            (self.end_after_chunks, "end"),
        )
        cuts = [(after, cut) for after, cut in candidates if after is not None]
        return min(cuts) if cuts else None


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _choice(
    delta: dict[str, Any], finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"delta": delta, "finish_reason": finish_reason, "index": 0, "logprobs": None, **extra}


def _text_delta(content: str | None) -> dict[str, Any]:
    return {"content": content, "reasoning_content": None, "reasoning_encrypted": False}


def _tool_delta(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    function = {"arguments": arguments, "name": name}
    call = {"function": function, "id": call_id, "index": 0, "type": "function"}
    return {"content": "", "reasoning_content": None, "role": None, "tool_calls": [call]}


@attrs.frozen
class _StreamEvents:
    opening: bytes
    content: list[bytes]  # the events Behaviour's *_after_chunks counters count
    closing: list[bytes]  # finish chunk, usage chunk if separate, [DONE]

    def garbled(self) -> _StreamEvents:
        return _StreamEvents(_GARBAGE_EVENT, [_GARBAGE_EVENT] * len(self.content), [_DONE_EVENT])


@attrs.define
class _Completion:
    """One generated answer, rendered either as a JSON body or as SSE events."""

    model: str
    pieces: list[str]  # reply text, or tool-call arguments when tool_name is set
    prompt_tokens: int
    tool_name: str | None
    include_cost: bool
    usage_mode: _UsageMode
    requested_venice_parameters: Any  # echoed (with Venice's defaults) by JSON answers only
    reasoning: str | None = None  # reasoning_content before the answer, as qwen3 models send it
    billing_override: dict[str, Any] | None = None
    nameless: Literal["empty", "missing"] | None = None  # see Behaviour.nameless_tool_call
    truncated: bool = False  # cut at the request's max_tokens: finish_reason "length"
    id: str = attrs.field(factory=lambda: "chatcmpl-" + os.urandom(16).hex())
    created: int = attrs.field(factory=lambda: int(time.time()))

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    @property
    def finish_reason(self) -> str:
        if self.truncated:
            return "length"
        return "stop" if self.tool_name is None else "tool_calls"

    def billing(self) -> dict[str, Any]:
        """`usage` plus `cost` (unless Venice would omit it)."""
        if self.billing_override is not None:
            return self.billing_override
        prompt, completion = self.prompt_tokens, self.completion_tokens
        billing: dict[str, Any] = {
            "usage": {
                "completion_tokens": completion,
                "prompt_tokens": prompt,
                "prompt_tokens_details": {"cached_tokens": 0},
                "total_tokens": prompt + completion,
            }
        }
        if self.include_cost:
            billing["cost"] = {"diem": 0, "usd": expected_cost_usd(prompt, completion)}
        return billing

    def _named(self, function: dict[str, Any]) -> dict[str, Any]:
        """A tool call's function with the name as the scripted behaviour has it."""
        if self.nameless == "empty":
            return {**function, "name": ""}
        if self.nameless == "missing":
            return {key: value for key, value in function.items() if key != "name"}
        return function

    def tool_call_id(self) -> str:
        # Derived from the completion id so stream and JSON agree without storing more state.
        return "call_" + self.id[-24:]

    def response_body(self) -> bytes:
        text = "".join(self.pieces)
        tool_calls: list[dict[str, Any]] = []
        if self.tool_name is not None:
            function = self._named({"arguments": text, "name": self.tool_name})
            tool_calls = [{"function": function, "id": self.tool_call_id(), "type": "function"}]
            text = ""
        message = {
            "annotations": None,
            "audio": None,
            "content": text,
            "function_call": None,
            "reasoning_content": self.reasoning,
            "reasoning_encrypted": False,
            "refusal": None,
            "role": "assistant",
            "tool_calls": tool_calls,
        }
        choice = {
            "finish_reason": self.finish_reason,
            "index": 0,
            "logprobs": None,
            "message": message,
            "stop_reason": None,
            "token_ids": None,
        }
        return orjson.dumps(
            {
                "choices": [choice],
                "created": self.created,
                "id": self.id,
                "kv_transfer_params": None,
                "model": self.model,
                "object": "chat.completion",
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "service_tier": None,
                "venice_parameters": _echo_venice_parameters(self.requested_venice_parameters),
                **self.billing(),
            }
        )

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk: dict[str, Any] = {
            "choices": choices,
            "created": self.created,
            "id": self.id,
            "model": self.model,
            "object": "chat.completion.chunk",
        }
        if self.usage_mode == "finish":
            # Mistral-style backends put "usage": null on every chunk but the billed one.
            chunk["usage"] = None
        chunk.update(extra)
        return _sse(chunk)

    def _reasoning_events(self) -> list[bytes]:
        pieces = split_reply(self.reasoning, 2) if self.reasoning else []
        return [
            self._chunk([_choice({"content": "", "reasoning_content": piece}, token_ids=None)])
            for piece in pieces
        ]

    def _content_events(self) -> list[bytes]:
        if self.tool_name is None:
            return self._reasoning_events() + [
                self._chunk([_choice(_text_delta(piece), token_ids=None)]) for piece in self.pieces
            ]
        # Venice names the call once with empty arguments, then streams argument fragments.
        first = _tool_delta(self.tool_call_id(), self.tool_name, "")
        first["tool_calls"][0]["function"] = self._named(first["tool_calls"][0]["function"])
        deltas = [first]
        deltas += [_tool_delta(None, None, piece) for piece in self.pieces]
        return self._reasoning_events() + [self._chunk([_choice(delta)]) for delta in deltas]

    def _closing_events(self) -> list[bytes]:
        finish_choice = _choice(
            _text_delta("" if self.tool_name is None else None),
            self.finish_reason,
            stop_reason=None,
            token_ids=None,
        )
        if self.usage_mode == "finish":
            return [self._chunk([finish_choice], **self.billing()), _DONE_EVENT]
        events = [self._chunk([finish_choice])]
        if self.usage_mode == "separate":
            events.append(self._chunk([], **self.billing()))
        events.append(_DONE_EVENT)
        return events

    def stream_events(self) -> _StreamEvents:
        opening = self._chunk(
            [_choice({**_text_delta(""), "role": "assistant"})], prompt_token_ids=None
        )
        return _StreamEvents(opening, self._content_events(), self._closing_events())


def _echo_venice_parameters(requested: Any) -> dict[str, Any]:
    echo = dict(_VENICE_PARAMETER_DEFAULTS)
    if isinstance(requested, dict):
        echo.update((k, v) for k, v in requested.items() if k in _ECHOED_VENICE_PARAMETERS)
    echo["web_search_citations"] = []
    return echo


def _last_role(messages: list[Any]) -> Any:
    last = messages[-1] if messages else None
    return last.get("role") if isinstance(last, dict) else None


def _prefill(messages: list[Any]) -> str | None:
    """The text of a trailing assistant message (a prefill), if the messages end with one."""
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        content = last.get("content")
        return content if isinstance(content, str) else None
    return None


def _first_tool_name(tools: Any) -> str | None:
    if not isinstance(tools, list) or not tools:
        return None
    first = tools[0]
    function = first.get("function") if isinstance(first, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else "tool"


def _embedding(text: str, dimensions: int) -> list[float]:
    # Seeded by the text so equal inputs embed equally across runs and processes.
    rng = random.Random(zlib.crc32(text.encode()))
    return [round(rng.uniform(-0.2, 0.2), 6) for _ in range(dimensions)]


def _embeddings_body(body: dict[str, Any]) -> bytes:
    raw_input = body["input"]
    inputs: list[str] = [raw_input] if isinstance(raw_input, str) else raw_input
    dimensions = body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    tokens = max(1, sum(len(text.split()) for text in inputs))
    data = [
        {"embedding": _embedding(text, dimensions), "index": index, "object": "embedding"}
        for index, text in enumerate(inputs)
    ]
    return orjson.dumps(
        {
            "data": data,
            "model": body["model"],
            "object": "list",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


# ---------------------------------------------------------------------------------------------
# Responses (alpha, stateless), images and audio (swagger /responses, /images/generations,
# /audio/speech, /audio/transcriptions)

# ResponsesRequest's fields: no instructions, text, store, previous_response_id, metadata, ...
RESPONSES_FIELDS = frozenset(
    {
        "model", "input", "include", "max_output_tokens", "temperature", "top_p", "reasoning",
        "tools", "tool_choice", "web_search", "stream", "fallbacks", "venice_parameters",
    }
)  # fmt: skip
# A 1x1 transparent PNG: what the fake "generates".
PNG_1X1_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)
SPEECH_CHUNKS = 4
TRANSCRIPT = "Hello from fake Venice transcription."


def speech_audio(text: str) -> bytes:
    """The fake 'MP3' for ``text``: an ID3 header and bytes derived from the text."""
    return b"ID3\x04\x00\x00\x00\x00\x00\x00" + text.encode() * 64


def _responses_rejection(body: Any) -> _Rejection | None:
    rejection = _body_rejection(body)
    if rejection is not None:
        return rejection
    if unknown := sorted(body.keys() - RESPONSES_FIELDS):
        keys = ", ".join(f"'{key}'" for key in unknown)
        return 400, detailed_error_body(
            None, f"Unrecognized key(s) in object: {keys}", "unrecognized_keys"
        )
    if not isinstance(body.get("input"), str | list):
        return 400, detailed_error_body("input", "Required", "invalid_type")
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        # [SW] documents nested, chat-style function tools only.
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" not in tool:
            return 400, detailed_error_body("tools", "Required: function", "invalid_type")
    return _model_rejection(body["model"])


def _responses_words(inputs: Any) -> int:
    if isinstance(inputs, str):
        return max(1, len(inputs.split()))
    words = 0
    for item in inputs:
        if isinstance(item, dict):
            words += _count_words(item.get("content")) + _count_words(item.get("output"))
    return max(1, words)


def responses_output(body: dict[str, Any], reply: str) -> list[dict[str, Any]]:
    """A function call when tools are offered and the last item is not a tool result, else text."""
    inputs = body["input"]
    last = inputs[-1] if isinstance(inputs, list) and inputs else {}
    tool_name = _first_tool_name(body.get("tools"))
    suffix = os.urandom(12).hex()
    if tool_name is not None and last.get("type") != "function_call_output":
        return [
            {
                "type": "function_call",
                "id": "fc_" + suffix,
                "call_id": "call_" + suffix,
                "name": tool_name,
                "arguments": TOOL_ARGUMENTS,
                "status": "completed",
            }
        ]
    content = [{"type": "output_text", "text": reply, "annotations": []}]
    return [
        {
            "type": "message",
            "id": "msg_" + suffix,
            "status": "completed",
            "role": "assistant",
            "content": content,
        }
    ]


def responses_body(body: dict[str, Any], reply: str) -> dict[str, Any]:
    output = responses_output(body, reply)
    prompt = _responses_words(body["input"])
    completion = (
        sum(
            len(split_reply(part["text"], 5)) for item in output for part in item.get("content", [])
        )
        or 1
    )
    return {
        "id": "resp_" + os.urandom(16).hex(),
        "object": "response",
        "created_at": int(time.time()),
        "model": body["model"],
        "status": "completed",
        "output": output,
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }


def responses_events(response: dict[str, Any]) -> list[bytes]:
    """The stream of ``response``: data-only frames and a final [DONE], as Venice sends them."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                {"type": "response.content_part.added", **where, "content_index": 0, "part": part}
            )
            for piece in split_reply(text, 5):
                events.append(
                    {
                        "type": "response.output_text.delta",
                        **where,
                        "content_index": 0,
                        "delta": piece,
                    }
                )
            events.append(
                {"type": "response.output_text.done", **where, "content_index": 0, "text": text}
            )
            events.append(
                {
                    "type": "response.content_part.done",
                    **where,
                    "content_index": 0,
                    "part": item["content"][0],
                }
            )
        else:
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    **where,
                    "delta": item["arguments"],
                }
            )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    framed = [_sse({**event, "sequence_number": number}) for number, event in enumerate(events)]
    return [*framed, _DONE_EVENT]


def _image_rejection(body: Any) -> _Rejection | None:
    rejection = _body_rejection(body)
    if rejection is not None:
        return rejection
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not 1 <= len(prompt) <= 1500:
        return 400, detailed_error_body("prompt", "Required", "invalid_type")
    return _model_rejection(body["model"])


def image_body(body: dict[str, Any]) -> bytes:
    image = (
        {"url": "data:image/png;base64," + PNG_1X1_B64}
        if body.get("response_format") == "url"
        else {"b64_json": PNG_1X1_B64}
    )
    return orjson.dumps({"created": int(time.time()), "data": [image]})


def _speech_rejection(body: Any) -> _Rejection | None:
    rejection = _body_rejection(body)
    if rejection is not None:
        return rejection
    text = body.get("input")
    if not isinstance(text, str) or not 1 <= len(text) <= 4096:
        return 400, detailed_error_body("input", "Required", "invalid_type")
    return _model_rejection(body["model"])


_STATIC_HEADERS: dict[str, str] = {
    "x-venice-version": VENICE_VERSION,
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "499",
    "x-ratelimit-limit-tokens": "1000000",
    "x-ratelimit-remaining-tokens": "999000",
}
_BALANCE_HEADERS: dict[str, str] = {
    "x-venice-balance-usd": "12.3456",
    "x-venice-balance-diem": "100.0",
}
_RESET_WINDOW_MS = 60_000


def _hang_up(request: web.BaseRequest) -> None:
    # close() (not abort()) so what was already written reaches the client before the FIN;
    # the missing chunked terminator / short Content-Length is what the client must notice.
    if request.transport is not None:
        request.transport.close()


@attrs.define
class _Pacer:
    """Writes SSE events one `write()` each (in the Behaviour's framing), `delay` apart."""

    response: web.StreamResponse
    behaviour: Behaviour
    sent: int = 0

    async def send(self, event: bytes) -> None:
        behaviour = self.behaviour
        if behaviour.chunk_delay and self.sent:
            await asyncio.sleep(behaviour.chunk_delay)
        if behaviour.reframes:
            event = behaviour.frame(event)
        if behaviour.split_line_ends:
            await self.response.write(event[:-1])
            await asyncio.sleep(0.005)
            event = event[-1:]
        await self.response.write(event)
        self.sent += 1


async def _send_oversized_event(response: web.StreamResponse, size: int) -> None:
    """``data: xxx...`` of ``size`` bytes with no line ending, in 64 KiB writes."""
    piece = b"x" * 65536
    await response.write(b"data: ")
    for _ in range(size // len(piece)):
        await response.write(piece)


class FakeVenice:
    """The fake upstream. Constructor options are plain attributes tests may change at any time."""

    def __init__(
        self,
        *,
        reply: str = "Hello from fake Venice!",
        reasoning: str | None = None,
        chunks: int = 5,
        usage_placement: UsagePlacement = "separate",
        usage_always: bool = True,
        include_cost: bool = True,
        strict_fields: bool = False,
        refused_params: frozenset[str] = frozenset(),
        record_requests: bool = True,
    ) -> None:
        self.reply = reply
        self.reasoning = reasoning
        self.tool_call: tuple[str, str] | None = None  # (name, JSON arguments) when offered tools
        # A trailing assistant message is continued (the reply's rest), not answered anew.
        self.continues_prefill = False
        # A chunk is a token, and the answer stops at the request's max_(completion_)tokens.
        self.honours_max_tokens = False
        self.chunks = chunks
        self.usage_placement: UsagePlacement = usage_placement
        self.usage_always = usage_always
        self.include_cost = include_cost
        self.strict_fields = strict_fields
        # Chat parameters answered with a 400, as an upstream that does not take them answers.
        self.refused_params = refused_params
        # The standalone benchmark server turns this off so memory stays flat.
        self.record_requests = record_requests
        self.default_behaviour = Behaviour()
        # A request whose body holds ``poison[0]`` is answered with ``poison[1]`` (content only this
        # upstream cannot serve: what a hostile caller crafts), whatever comes next otherwise.
        self.poison: tuple[bytes, Behaviour] | None = None
        self.received: list[ReceivedRequest] = []
        self.active_streams = 0
        self.cancelled_streams = 0
        self.completed_streams = 0
        self._behaviours: collections.deque[Behaviour] = collections.deque()
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._closing = asyncio.Event()
        self._ray_prefix = os.urandom(4).hex()
        self._ray_count = 0

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/api/v1/chat/completions", self._chat)
        app.router.add_post("/api/v1/embeddings", self._embeddings)
        app.router.add_post("/api/v1/responses", self._responses)
        app.router.add_post("/api/v1/images/generations", self._images)
        app.router.add_post("/api/v1/audio/speech", self._speech)
        app.router.add_post("/api/v1/audio/transcriptions", self._transcriptions)
        app.router.add_get("/api/v1/models", self._models)
        app.router.add_route("*", "/{tail:.*}", self._unknown_route)
        # handler_cancellation: a client that goes away must cancel a stalled or sleeping
        # stream, as it would cancel generation at Venice.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await runner.setup()
        # A real provider accepts thousands of connections at once; aiohttp's default queue of
        # 128 overflowed under bench.streams' 2,000, and each dropped connect cost 1-7 s.
        await web.TCPSite(runner, host, port, backlog=4096).start()
        self._runner = runner
        self._port = runner.addresses[0][1]
        self._closing.clear()

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeVenice:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeVenice is not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    # -- scripting ------------------------------------------------------------------------

    def enqueue(self, *behaviours: Behaviour) -> None:
        self._behaviours.extend(behaviours)

    def chats(self) -> list[ReceivedRequest]:
        """The chat completions received: not the model listings a gateway makes on its own."""
        return [r for r in self.received if r.path.endswith("/chat/completions")]

    def fail_times(self, n: int, status: int = 503, retry_after: str | None = None) -> None:
        self.enqueue(*(Behaviour(status=status, retry_after=retry_after) for _ in range(n)))

    def _next_behaviour(self) -> Behaviour:
        return self._behaviours.popleft() if self._behaviours else self.default_behaviour

    # -- plumbing -------------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> Any:
        """Parse and record the request; a body that is not JSON comes back as _NOT_JSON."""
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else _NOT_JSON
        except orjson.JSONDecodeError:
            body = _NOT_JSON
        if self.record_requests:
            headers = {name.lower(): value for name, value in request.headers.items()}
            json_body = None if body is _NOT_JSON else body
            self.received.append(ReceivedRequest(request.method, request.path, headers, json_body))
        return body

    def _headers(
        self, content_type: str, behaviour: Behaviour | None = None, model: str | None = None
    ) -> dict[str, str]:
        self._ray_count += 1
        reset = str(int(time.time() * 1000) + _RESET_WINDOW_MS)
        headers = {
            **_STATIC_HEADERS,
            "CF-RAY": f"{self._ray_prefix}{self._ray_count:08x}-SJC",
            "Content-Type": content_type,
            "x-ratelimit-reset-requests": reset,
            "x-ratelimit-reset-tokens": reset,
        }
        if model is not None:
            headers["x-venice-model-id"] = model
            headers["x-venice-model-name"] = _MODEL_NAMES.get(model, model)
            headers.update(_BALANCE_HEADERS)
        if behaviour is not None:
            if not behaviour.rate_limit_headers:
                del headers["x-ratelimit-reset-requests"], headers["x-ratelimit-reset-tokens"]
            if behaviour.retry_after is not None:
                headers["Retry-After"] = behaviour.retry_after
            if behaviour.ratelimit_reset_ms is not None:
                headers["x-ratelimit-reset-requests"] = str(behaviour.ratelimit_reset_ms)
        return headers

    def _reject(self, rejection: _Rejection) -> web.Response:
        status, body = rejection
        return web.Response(status=status, body=body, headers=self._headers(JSON_CONTENT_TYPE))

    async def _admit(
        self, request: web.Request, reject: Callable[[Any], _Rejection | None]
    ) -> tuple[dict[str, Any], Behaviour] | web.Response:
        """Auth, validation, then the scripted stall and status of the next Behaviour.

        Returns the request body and its Behaviour, or the finished error answer. Requests
        Venice would reject anyway do not consume a Behaviour.
        """
        body = await self._receive(request)
        rejection = _auth_rejection(request.headers.get("Authorization")) or reject(body)
        if rejection is not None:
            return self._reject(rejection)
        if self.poison is not None and self.poison[0] in orjson.dumps(body):
            behaviour = self.poison[1]
        else:
            behaviour = self._next_behaviour()
        if behaviour.delay_before_headers:
            await asyncio.sleep(behaviour.delay_before_headers)
        if behaviour.reset_before_headers:
            _hang_up(request)
            raise asyncio.CancelledError  # aiohttp ends a handler whose client is gone this way
        if behaviour.status == 200:
            return body, behaviour
        model = body["model"]
        error_body = behaviour.error_body or venice_error_body(behaviour.status, model)
        headers = self._headers(JSON_CONTENT_TYPE, behaviour, model)
        return web.Response(status=behaviour.status, body=error_body, headers=headers)

    async def _send_json(
        self, request: web.Request, behaviour: Behaviour, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        if behaviour.garbage:
            body = _GARBAGE_BODY
        if not behaviour.close_mid_body:
            return web.Response(body=body, headers=headers)
        response = web.StreamResponse(headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        _hang_up(request)
        return response

    # -- routes ---------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, self._chat_rejection)
        if isinstance(admitted, web.Response):
            return admitted
        body, behaviour = admitted
        completion = self._completion(body, behaviour.reply)
        completion.billing_override = behaviour.billing
        completion.nameless = behaviour.nameless_tool_call
        if behaviour.response_id is not None:
            completion.id = behaviour.response_id
        if body.get("stream") is True and not behaviour.json_answer:
            return await self._stream(request, behaviour, completion)
        headers = self._headers(JSON_CONTENT_TYPE, behaviour, completion.model)
        return await self._send_json(request, behaviour, completion.response_body(), headers)

    def _chat_rejection(self, body: Any) -> _Rejection | None:
        return _chat_rejection(body, self.strict_fields, self.refused_params)

    def _completion(self, body: dict[str, Any], reply: str | None = None) -> _Completion:
        # With tools the model calls one (the first, unless tool_call names it), and answers in
        # text once it has the results.
        offered = _first_tool_name(body.get("tools"))
        tool_name = None if _last_role(body["messages"]) == "tool" else offered
        arguments = TOOL_ARGUMENTS
        if tool_name is not None and self.tool_call is not None:
            tool_name, arguments = self.tool_call
        text = (reply or self.reply) if tool_name is None else arguments
        prefill = _prefill(body["messages"]) if self.continues_prefill else None
        if prefill is not None and text.startswith(prefill):
            text = text[len(prefill) :]  # the model continues the assistant's message
        pieces = split_reply(text, self.chunks)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        truncated = self.honours_max_tokens and isinstance(limit, int) and len(pieces) > limit
        if truncated:
            pieces = pieces[:limit]
        return _Completion(
            model=body["model"],
            pieces=pieces,
            truncated=truncated,
            prompt_tokens=count_prompt_tokens(body["messages"]),
            tool_name=tool_name,
            include_cost=self.include_cost,
            usage_mode=self._usage_mode(body.get("stream_options")),
            requested_venice_parameters=body.get("venice_parameters"),
            reasoning=self.reasoning,
        )

    def _usage_mode(self, stream_options: Any) -> _UsageMode:
        requested = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        return self.usage_placement if self.usage_always or requested else "none"

    async def _stream(
        self, request: web.Request, behaviour: Behaviour, completion: _Completion
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers=self._headers(SSE_CONTENT_TYPE, behaviour, completion.model)
        )
        self.active_streams += 1
        try:
            await response.prepare(request)
            finished = await self._play(request, response, behaviour, completion)
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        except ConnectionResetError:
            # aiohttp handles the dead connection after the handler returns; raising would log.
            self.cancelled_streams += 1
            return response
        finally:
            self.active_streams -= 1
        if finished:
            self.completed_streams += 1
        return response

    async def _play(
        self,
        request: web.Request,
        response: web.StreamResponse,
        behaviour: Behaviour,
        completion: _Completion,
    ) -> bool:
        """Writes the stream as scripted; True when it ended with [DONE]."""
        events = completion.stream_events()
        if behaviour.garbage:
            events = events.garbled()
        pacer = _Pacer(response, behaviour)
        if behaviour.first_event_delay:
            await asyncio.sleep(behaviour.first_event_delay)
        await pacer.send(events.opening)
        if behaviour.oversized_event_bytes is not None:
            await _send_oversized_event(response, behaviour.oversized_event_bytes)
            _hang_up(request)
            return False
        if behaviour.endless:
            while not self._closing.is_set():
                await asyncio.sleep(behaviour.chunk_delay or 0.05)
                await response.write(events.content[0])
        cut = behaviour.stream_cut()
        for index, event in enumerate(events.content if cut is None else events.content[: cut[0]]):
            if index == behaviour.held_at and behaviour.hold is not None:
                await behaviour.hold.wait()
            if index == behaviour.garbage_after_chunks:
                await pacer.send(_GARBAGE_EVENT)
            await pacer.send(event)
        if cut is None:
            closing = events.closing[:-1] if behaviour.omit_done else events.closing
            for index, event in enumerate(closing):
                if index == 1 and behaviour.pause_before_usage:
                    await asyncio.sleep(behaviour.pause_before_usage)
                await pacer.send(event)
            return True
        if cut[1] == "error":
            await pacer.send(_MID_STREAM_ERROR_EVENT)
            await pacer.send(_DONE_EVENT)
            return True
        if cut[1] == "end":
            return False
        if cut[1] == "stall":
            await self._closing.wait()
        _hang_up(request)
        return False

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _embeddings_rejection)
        if isinstance(admitted, web.Response):
            return admitted
        body, behaviour = admitted
        headers = self._headers(JSON_CONTENT_TYPE, behaviour, body["model"])
        return await self._send_json(request, behaviour, _embeddings_body(body), headers)

    async def _models(self, request: web.Request) -> web.Response:
        await self._receive(request)
        # The listing needs no key, but a key that is presented is checked (assumed, unrecorded).
        authorization = request.headers.get("Authorization")
        if authorization is not None and authorization != f"Bearer {FAKE_VENICE_KEY}":
            return self._reject((401, _AUTH_FAILED_BODY))
        model_type = request.query.get("type", "text")
        body = _MODEL_LIST_BODIES.get(model_type)
        if body is None:
            message = f"Invalid enum value. Expected {' | '.join(sorted(_MODEL_TYPES))}"
            return self._reject((400, detailed_error_body("type", message, "invalid_enum_value")))
        return web.Response(body=body, headers=self._headers(JSON_CONTENT_TYPE))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _responses_rejection)
        if isinstance(admitted, web.Response):
            return admitted
        body, behaviour = admitted
        document = responses_body(body, self.reply)
        if body.get("stream") is not True:
            headers = self._headers(JSON_CONTENT_TYPE, behaviour, body["model"])
            return await self._send_json(request, behaviour, orjson.dumps(document), headers)
        response = web.StreamResponse(
            headers=self._headers(SSE_CONTENT_TYPE, behaviour, body["model"])
        )
        await response.prepare(request)
        pacer = _Pacer(response, behaviour)
        for event in responses_events(document):
            await pacer.send(event)
        return response

    async def _images(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _image_rejection)
        if isinstance(admitted, web.Response):
            return admitted
        body, behaviour = admitted
        headers = self._headers(JSON_CONTENT_TYPE, behaviour, body["model"])
        return await self._send_json(request, behaviour, image_body(body), headers)

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, _speech_rejection)
        if isinstance(admitted, web.Response):
            return admitted
        body, behaviour = admitted
        audio = speech_audio(body["input"])
        response = web.StreamResponse(headers=self._headers("audio/mpeg", behaviour, body["model"]))
        await response.prepare(request)
        pacer = _Pacer(response, behaviour)
        size = -(-len(audio) // SPEECH_CHUNKS)
        for sent, start in enumerate(range(0, len(audio), size)):
            if sent == behaviour.drop_after_chunks:
                _hang_up(request)
                return response
            await pacer.send(audio[start : start + size])
        return response

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        rejection = _auth_rejection(request.headers.get("Authorization"))
        if rejection is not None:
            await request.read()
            return self._reject(rejection)
        if request.content_type != "multipart/form-data":
            await request.read()
            return self._reject((415, venice_error_body(415)))
        fields: dict[str, str] = {}
        audio = b""
        async for part in await request.multipart():  # type: ignore[union-attr]
            data = await part.read()
            if part.name == "file":
                audio = bytes(data)
            elif part.name:
                fields[part.name] = bytes(data).decode()
        if self.record_requests:
            headers = {name.lower(): value for name, value in request.headers.items()}
            recorded = {**fields, "file_size": len(audio)}
            self.received.append(ReceivedRequest(request.method, request.path, headers, recorded))
        if not audio:
            return self._reject((422, orjson.dumps({"error": "Audio file is empty"})))
        behaviour = self._next_behaviour()
        model = fields.get("model", "nvidia/parakeet-tdt-0.6b-v3")
        if behaviour.status != 200:
            error = behaviour.error_body or venice_error_body(behaviour.status, model)
            headers = self._headers(JSON_CONTENT_TYPE, behaviour, model)
            return web.Response(status=behaviour.status, body=error, headers=headers)
        if fields.get("response_format") == "text":
            return web.Response(
                body=TRANSCRIPT.encode(), headers=self._headers("text/plain; charset=utf-8")
            )
        document = {"text": TRANSCRIPT, "duration": round(len(audio) / 16000, 3)}
        return web.Response(
            body=orjson.dumps(document), headers=self._headers(JSON_CONTENT_TYPE, model=model)
        )

    async def _unknown_route(self, request: web.Request) -> web.Response:
        await self._receive(request)
        return self._reject((404, _ROUTE_NOT_FOUND_BODY))


# ---------------------------------------------------------------------------------------------
# Standalone server


class ThreadedFakeVenice:
    """The fake Venice on its own loop in a thread, restartable on the same port (Venice down),
    so it outlives a test's event loop: gateway processes shared by a module's tests use it."""

    def __init__(self, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake: FakeVenice = self._run(self._make(options))
        self.port = self.fake.port

    async def _make(self, options: dict[str, Any]) -> FakeVenice:
        fake = FakeVenice(**options)
        await fake.start()
        return fake

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    def enqueue(self, *behaviours: Behaviour) -> None:
        self.loop.call_soon_threadsafe(self.fake.enqueue, *behaviours)

    def behave(self, behaviour: Behaviour) -> None:
        """How every request is answered from now on (a test's retries included)."""
        self.fake.default_behaviour = behaviour

    def received(self) -> list[ReceivedRequest]:
        """What it was sent so far (a copy, taken on its own loop)."""
        return self._run(self._received())

    async def _received(self) -> list[ReceivedRequest]:
        return list(self.fake.received)

    def reset(self) -> None:
        self._run(self._reset())

    async def _reset(self) -> None:
        self.fake.default_behaviour = Behaviour()
        self.fake.received.clear()
        while self.fake._behaviours:  # what a failed test left queued must not leak onward
            self.fake._behaviours.popleft()

    def stop_serving(self) -> None:
        self._run(self.fake.close())

    def start_serving(self) -> None:
        self._run(self.fake.start(port=self.port))

    def close(self) -> None:
        self._run(self.fake.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run the fake Venice upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099, help="0 picks a free port")
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--reply", default="Hello from fake Venice!")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    fake = FakeVenice(reply=args.reply, chunks=args.chunks, record_requests=False)
    fake.default_behaviour.chunk_delay = args.chunk_delay
    await fake.start(host=args.host, port=args.port)
    print(f"listening on http://{args.host}:{fake.port}/api/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await fake.close()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    # Use uvloop when it is installed: the benchmark needs the fake to outpace the gateway.
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(args))


if __name__ == "__main__":
    main(sys.argv[1:])
