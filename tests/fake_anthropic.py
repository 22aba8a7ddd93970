"""A fake Anthropic Messages API, behaving as ``shared/anthropic-messages.md`` says the real one does.

A real aiohttp server on 127.0.0.1 (the base URL is the root, as the anthropic SDK takes it):

- ``POST /v1/messages``: the key as ``x-api-key`` or ``Authorization: Bearer`` (else 401),
  ``anthropic-version`` required (else 400), ``max_tokens`` required, errors as
  ``{"type":"error","error":{...},"request_id":...}``. It answers text, or (with ``tools``, unless
  the last turn holds a tool_result) a ``tool_use`` of the first tool; with ``thinking`` enabled a
  thinking block with a signature comes first, and a thinking block sent back in history must carry
  the signature this fake issued for its text (as Anthropic checks them). A trailing assistant turn
  is continued (prefill), and refused when it ends in whitespace. Usage reports cache reads and
  writes (``cache_creation.ephemeral_1h_input_tokens`` among them). Streams are framed
  ``event:``/``data:`` with message_start, content_block_start/delta/stop (text_delta,
  thinking_delta, signature_delta, input_json_delta), ping, message_delta (cumulative usage) and
  message_stop.
- ``POST /v1/messages/count_tokens`` (an exact count of its own, unlike the gateway's estimate) and
  ``GET /v1/models`` (Anthropic's shape).

Tests script failures with :meth:`FakeAnthropic.fail_next` (529 is ``overloaded_error``) or
:meth:`FakeAnthropic.error_mid_stream`, and read what it got in ``received``: each body byte for
byte, with the headers. A hostile upstream is scripted with its attributes: ``usage_patch`` (over
the answer's and ``message_start``'s usage; ``usage_patch = None`` sends no usage at all),
``final_usage_patch`` (over ``message_delta``'s), ``restart_usage`` (a second ``message_start``
with that usage), ``before_final`` (raw bytes sent before ``message_delta``) and
``stall_before_final`` (the stream stops there and sends nothing more until the fake closes).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
from typing import Any

import attrs
import orjson
from aiohttp import web

from llmgw.translation.anthropic import error_body
from tests.fake_venice import split_reply
from tests.processes import ServedHere

FAKE_ANTHROPIC_KEY = "sk-ant-fake-key-0a7c1e"
FAKE_ANTHROPIC_MODELS = ("claude-sonnet-4-5", "claude-haiku-4-5")
# What every answer reports besides its input: cache reads and writes (of which 1 h).
CACHE_READ = 1200
CACHE_CREATION = 300
CACHE_CREATION_1H = 100
THINKING = "The user wants a greeting; I should answer briefly."
# Error messages Anthropic answers with, per status.
_MESSAGES = {
    400: "Invalid request.",
    401: "invalid x-api-key",
    429: "Number of request tokens has exceeded your per-minute rate limit.",
    500: "Internal server error",
    529: "Overloaded",
}


@attrs.frozen
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes  # byte for byte

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


def signature(thinking: str) -> str:
    """The signature this fake gives a thinking text (opaque to everyone else)."""
    return "EqQB" + hashlib.sha256(b"fake-anthropic:" + thinking.encode()).hexdigest()


def input_tokens(body: dict[str, Any]) -> int:
    """This fake's exact count: 1 per 4 bytes of the system, messages and tools, at least 1."""
    counted = orjson.dumps([body.get("system"), body.get("messages"), body.get("tools")])
    return max(1, len(counted) // 4)


def _error(status: int, message: str | None = None) -> web.Response:
    document = {
        **error_body(status, message or _MESSAGES.get(status, "Error")),
        "request_id": "req_0",
    }
    return web.json_response(document, status=status, headers={"request-id": "req_0"})


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return (
        b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **payload}) + b"\n\n"
    )


class FakeAnthropic(ServedHere):
    def __init__(self, *, reply: str = "Hello from fake Claude!", chunks: int = 3) -> None:
        self.reply = reply
        self.chunks = chunks
        self.received: list[Received] = []
        self.streamed: list[bytes] = []  # each stream's bytes, as written
        self._failures: collections.deque[int] = collections.deque()
        self._count_failures: collections.deque[int] = collections.deque()
        self._mid_stream_errors: collections.deque[str] = collections.deque()
        self.usage_patch: dict[str, Any] | None = {}
        self.final_usage_patch: dict[str, Any] = {}
        self.restart_usage: dict[str, Any] | None = None
        self.before_final = b""
        self.stall_before_final = False
        self._closing = asyncio.Event()

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing.set()  # a stalled stream ends
        await super().__aexit__(*exc_info)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, *statuses: int) -> None:
        """The next /v1/messages requests answer these statuses, one each, in order."""
        self._failures.extend(statuses)

    def fail_counts_next(self, *statuses: int) -> None:
        """The next /v1/messages/count_tokens requests answer these statuses, one each."""
        self._count_failures.extend(statuses)

    def error_mid_stream(self, error_type: str = "overloaded_error") -> None:
        """The next stream sends its first text, then an ``error`` event, and ends."""
        self._mid_stream_errors.append(error_type)

    def calls(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _admit(self, request: web.Request) -> dict[str, Any] | web.Response:
        raw = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.received.append(Received(request.path, headers, raw))
        keys = (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
        if FAKE_ANTHROPIC_KEY not in keys:
            return _error(401)
        if "anthropic-version" not in headers:
            return _error(400, "anthropic-version: header is required")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(400, "There was an error parsing the body of your request.")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "messages: Field required")
        return body

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self._admit(request)
        if isinstance(body, web.Response):
            return body
        if self._count_failures:
            return _error(self._count_failures.popleft())
        return web.json_response({"input_tokens": input_tokens(body)})

    async def _models(self, request: web.Request) -> web.Response:
        self.received.append(Received(request.path, dict(request.headers), b""))
        data = [
            {
                "type": "model",
                "id": model,
                "display_name": model.replace("-", " ").title(),
                "created_at": "2025-09-29T00:00:00Z",
            }
            for model in FAKE_ANTHROPIC_MODELS
        ]
        return web.json_response(
            {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]}
        )

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._admit(request)
        if isinstance(body, web.Response):
            return body
        if self._failures:
            return _error(self._failures.popleft())
        problem = _refusal(body)
        if problem is not None:
            return _error(400, problem)
        content = self._content(body)
        stop_reason = "tool_use" if content[-1]["type"] == "tool_use" else "end_turn"
        usage = {
            "input_tokens": input_tokens(body),
            "cache_creation_input_tokens": CACHE_CREATION,
            "cache_read_input_tokens": CACHE_READ,
            "cache_creation": {
                "ephemeral_5m_input_tokens": CACHE_CREATION - CACHE_CREATION_1H,
                "ephemeral_1h_input_tokens": CACHE_CREATION_1H,
            },
            "output_tokens": sum(len(_block_text(block)) // 4 + 1 for block in content),
        }
        message = {
            "id": "msg_" + os.urandom(12).hex(),
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        if body.get("stream") is not True:
            if self.usage_patch is None:
                del message["usage"]
            else:
                message["usage"] = {**usage, **self.usage_patch}
            return web.json_response(message)
        return await self._stream(request, message)

    def _content(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            content.append(
                {"type": "thinking", "thinking": THINKING, "signature": signature(THINKING)}
            )
        messages = body["messages"]
        last = messages[-1] if messages else {}
        tools = body.get("tools")
        if isinstance(tools, list) and tools and not _ends_with_tool_result(last):
            content.append(
                {
                    "type": "tool_use",
                    "id": "toolu_" + os.urandom(8).hex(),
                    "name": tools[0]["name"],
                    "input": {"a": 4, "b": 6},
                }
            )
            return content
        reply = self.reply
        if last.get("role") == "assistant":  # a prefill: only the rest of the reply
            prefix = _text(last.get("content"))
            reply = reply[len(prefix) :] if reply.startswith(prefix) else reply
        content.append({"type": "text", "text": reply})
        return content

    async def _stream(self, request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.streamed.append(b"")

        async def write(data: bytes) -> None:
            self.streamed[-1] += data
            await response.write(data)

        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None}
        if self.usage_patch is None:
            del start["usage"]
        else:
            start["usage"] = {**usage, "output_tokens": 1, **self.usage_patch}
        await write(_event("message_start", {"message": start}))
        if self.restart_usage is not None:
            again = {**start, "usage": self.restart_usage}
            await write(_event("message_start", {"message": again}))
        for index, block in enumerate(message["content"]):
            await write(b"".join(self._block_events(index, block)))
            if index == 0:
                await write(_event("ping", {}))
            if self._mid_stream_errors:
                error = {"type": self._mid_stream_errors.popleft(), "message": "Overloaded"}
                await write(_event("error", {"error": error}))
                return response
        if self.before_final:
            await write(self.before_final)
        if self.stall_before_final:
            await self._closing.wait()
            return response
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        final_usage = {"output_tokens": usage["output_tokens"], **self.final_usage_patch}
        await write(_event("message_delta", {"delta": delta, "usage": final_usage}))
        await write(_event("message_stop", {}))
        return response

    def _block_events(self, index: int, block: dict[str, Any]) -> list[bytes]:
        kind = block["type"]
        events: list[bytes] = []
        if kind == "text":
            events.append(
                _event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            for piece in split_reply(block["text"], self.chunks):
                delta = {"type": "text_delta", "text": piece}
                events.append(_event("content_block_delta", {"index": index, "delta": delta}))
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            events.append(_event("content_block_start", {"index": index, "content_block": start}))
            for piece in split_reply(block["thinking"], self.chunks):
                delta = {"type": "thinking_delta", "thinking": piece}
                events.append(_event("content_block_delta", {"index": index, "delta": delta}))
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(_event("content_block_delta", {"index": index, "delta": delta}))
        else:
            start = {**block, "input": {}}
            events.append(_event("content_block_start", {"index": index, "content_block": start}))
            arguments = orjson.dumps(block["input"]).decode()
            for piece in ["", *split_reply(arguments, self.chunks)]:
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(_event("content_block_delta", {"index": index, "delta": delta}))
        events.append(_event("content_block_stop", {"index": index}))
        return events


def _refusal(body: dict[str, Any]) -> str | None:
    """Why Anthropic would answer 400, as it words it; None when it would not."""
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return "max_tokens: Field required"
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if budget >= max_tokens:
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
    messages = body["messages"]
    for index, message in enumerate(messages):
        for block in message.get("content") if isinstance(message.get("content"), list) else []:
            if block.get("type") == "thinking" and block.get("signature") != signature(
                block.get("thinking", "")
            ):
                return f"messages.{index}.content: Invalid `signature` in `thinking` block"
    last = messages[-1] if messages else {}
    if (
        last.get("role") == "assistant"
        and _text(last.get("content")) != _text(last.get("content")).rstrip()
    ):
        return "messages: final assistant content cannot end with trailing whitespace"
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    blocks = content if isinstance(content, list) else []
    return "".join(
        b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )


def _block_text(block: dict[str, Any]) -> str:
    return str(block.get("text") or block.get("thinking") or block.get("input") or "")


def _ends_with_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )
