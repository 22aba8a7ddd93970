"""A second fake upstream, shaped like OpenAI's API (no ``cost``, no Venice fields), and a helper to
configure a gateway with several providers from a TOML file.

A real aiohttp server on 127.0.0.1 serving ``/v1/chat/completions`` (JSON, and SSE with a final
usage chunk when ``stream_options.include_usage``; with ``tools`` it calls the first one unless the
last message is a tool result), ``/v1/responses`` (OpenAI's own Responses, JSON and its ``event:``
framed stream without ``[DONE]``: a reasoning item with a summary when ``reasoning`` is asked for,
then a call of the first tool or the reply; ``incomplete`` when ``max_output_tokens`` is below the
reply's tokens), ``/v1/models`` and ``/v1/embeddings``. Tests script failures with
:meth:`FakeOpenAI.fail_next` and read what it was sent in ``received``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from pathlib import Path
from typing import Any, Generic, TypeVar

import orjson
from aiohttp import web

from llmgw.config import load_settings
from tests.fake_venice import (
    TOOL_ARGUMENTS,
    ReceivedRequest,
    _embeddings_body,  # OpenAI's embeddings shape already: data, model, object, usage
    count_prompt_tokens,
    split_reply,
)
from tests.processes import ServedHere

FAKE_OPENAI_KEY = "sk-fake-openai-key-51c0de"
FAKE_OPENAI_MODELS = ("gpt-4o-mini", "text-embedding-3-small")
REASONING_SUMMARY = "The user wants a sum."
# An item's parts in a Responses stream: the index they are at, and the events that open and
# close each part and fill its text.
_PART_EVENTS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "reasoning": (
        "summary_index",
        "response.reasoning_summary_part",
        "response.reasoning_summary_text",
        {},
    ),
    "message": ("content_index", "response.content_part", "response.output_text", {"logprobs": []}),
}

JSON = "application/json"
Failure = TypeVar("Failure")


def openai_error(status: int, message: str) -> web.Response:
    error = {
        "message": message,
        "type": "server_error" if status >= 500 else "invalid_request_error",
    }
    return web.json_response({"error": {**error, "param": None, "code": None}}, status=status)


class RecordingFake(ServedHere, Generic[Failure]):
    """A fake of an OpenAI-shaped API (OpenAI's, Azure's) that keeps every request it received
    and answers the failures it is told to, first."""

    def __init__(self, *, reply: str, chunks: int) -> None:
        self.reply = reply
        self.chunks = chunks
        self.received: list[ReceivedRequest] = []
        self._failures: collections.deque[Failure] = collections.deque()

    def fail_next(self, *failures: Failure) -> None:
        """The next chat/embeddings requests answer these, one each, in order."""
        self._failures.extend(failures)

    def calls(self, path: str) -> list[ReceivedRequest]:
        """What was received at ``path`` (without the query)."""
        return [r for r in self.received if r.path.partition("?")[0] == path]

    async def _record(self, request: web.Request) -> ReceivedRequest:
        """``request`` kept, its path with the query and its JSON body (None if it has none)."""
        body = orjson.loads(await request.read() or b"null")
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.received.append(ReceivedRequest(request.method, request.path_qs, headers, body))
        return self.received[-1]


class FakeOpenAI(RecordingFake[int]):
    """``fail_next`` takes statuses."""

    def __init__(self, *, reply: str = "Hello from fake OpenAI!", chunks: int = 4) -> None:
        super().__init__(reply=reply, chunks=chunks)
        # Set: a Responses stream waits for it before its last event (a test's answer in flight).
        self.end_held: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _admit(self, request: web.Request) -> dict[str, Any] | web.Response:
        body = (await self._record(request)).json
        if request.headers.get("Authorization") != f"Bearer {FAKE_OPENAI_KEY}":
            return openai_error(401, "Incorrect API key provided.")
        if self._failures:
            return openai_error(self._failures.popleft(), "The server had an error.")
        return body if isinstance(body, dict) else openai_error(400, "Expected an object.")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._admit(request)
        if isinstance(body, web.Response):
            return body
        completion_id = "chatcmpl-" + os.urandom(12).hex()
        base = {"id": completion_id, "created": int(time.time()), "model": body["model"]}
        call = _tool_call(body)
        pieces = split_reply(
            self.reply if call is None else call["function"]["arguments"], self.chunks
        )
        prompt = count_prompt_tokens(body.get("messages"))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(pieces),
            "total_tokens": prompt + len(pieces),
        }
        finish_reason = "stop" if call is None else "tool_calls"
        if body.get("stream") is not True:
            message: dict[str, Any] = {"role": "assistant", "content": self.reply}
            if call is not None:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": finish_reason}
            document = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            return web.json_response(document)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += reply_deltas(call, pieces)
        for delta in deltas:
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            await response.write(_event({**chunk, "choices": [choice]}))
        finish = {"index": 0, "delta": {}, "finish_reason": finish_reason}
        return await end_stream(response, chunk, finish, body, usage)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._admit(request)
        if isinstance(body, web.Response):
            return body
        response = self._response(body)
        if body.get("stream") is not True:
            return web.json_response(response)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        events = self._response_events(response)
        for number, event in enumerate(events):
            if number == len(events) - 1 and self.end_held is not None:
                await self.end_held.wait()
            payload = {**event, "sequence_number": number}
            await stream.write(f"event: {event['type']}\n".encode() + _event(payload))
        return stream

    def _response(self, body: dict[str, Any]) -> dict[str, Any]:
        suffix = os.urandom(12).hex()
        output: list[dict[str, Any]] = []
        if body.get("reasoning") is not None:
            output.append(
                {
                    "type": "reasoning",
                    "id": "rs_" + suffix,
                    "summary": [{"type": "summary_text", "text": REASONING_SUMMARY}],
                    "encrypted_content": "enc_" + suffix,
                }
            )
        inputs = body.get("input")
        last = inputs[-1] if isinstance(inputs, list) and inputs else {}
        tools = body.get("tools")
        if isinstance(tools, list) and tools and last.get("type") != "function_call_output":
            output.append(
                {
                    "type": "function_call",
                    "id": "fc_" + suffix,
                    "call_id": "call_" + suffix,
                    "name": tools[0].get("name", "tool"),
                    "arguments": TOOL_ARGUMENTS,
                    "status": "completed",
                }
            )
        else:
            text = {"type": "output_text", "text": self.reply, "annotations": [], "logprobs": []}
            output.append(
                {
                    "type": "message",
                    "id": "msg_" + suffix,
                    "status": "completed",
                    "role": "assistant",
                    "content": [text],
                }
            )
        produced = self.chunks + (len(output) - 1)
        limit = body.get("max_output_tokens")
        incomplete = isinstance(limit, int) and limit < produced
        prompt = max(1, len(orjson.dumps(inputs).split()))
        return {
            "id": "resp_" + suffix,
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"],
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": tools if isinstance(tools, list) else [],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": produced,
                "output_tokens_details": {"reasoning_tokens": len(output) - 1},
                "total_tokens": prompt + produced,
            },
        }

    def _response_events(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """OpenAI's events for ``response``: each text and each call's arguments in pieces."""
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
        ]
        for index, item in enumerate(response["output"]):
            where = {"item_id": item["id"], "output_index": index}
            kind = item["type"]
            if kind == "function_call":
                events.append(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "arguments": "", "status": "in_progress"},
                    }
                )
                events += [
                    {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                    for piece in split_reply(item["arguments"], self.chunks)
                ]
                done = {"arguments": item["arguments"], "name": item["name"]}
                events.append({"type": "response.function_call_arguments.done", **where, **done})
            else:
                field = "summary" if kind == "reasoning" else "content"
                opened = {**item, field: []}
                if "status" in item:
                    opened["status"] = "in_progress"
                events.append(
                    {"type": "response.output_item.added", "output_index": index, "item": opened}
                )
                for number, part in enumerate(item[field]):
                    events += self._part_events(kind, where, number, part)
            events.append(
                {"type": "response.output_item.done", "output_index": index, "item": item}
            )
        ending = (
            "response.completed" if response["status"] == "completed" else "response.incomplete"
        )
        events.append({"type": ending, "response": response})
        return events

    def _part_events(
        self, kind: str, where: dict[str, Any], number: int, part: dict[str, Any]
    ) -> list[dict[str, Any]]:
        position, parts, texts, extra = _PART_EVENTS[kind]
        at = {**where, position: number}
        events = [{"type": f"{parts}.added", **at, "part": {**part, "text": ""}}]
        events += [
            {"type": f"{texts}.delta", **at, "delta": piece, **extra}
            for piece in split_reply(part["text"], self.chunks)
        ]
        events.append({"type": f"{texts}.done", **at, "text": part["text"], **extra})
        events.append({"type": f"{parts}.done", **at, "part": part})
        return events

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._admit(request)
        if isinstance(body, web.Response):
            return body
        return web.Response(body=_embeddings_body(body), content_type=JSON)

    async def _models(self, request: web.Request) -> web.Response:
        self.received.append(ReceivedRequest(request.method, request.path, {}, None))
        data = [
            {"id": model, "object": "model", "created": 1715367049, "owned_by": "system"}
            for model in FAKE_OPENAI_MODELS
        ]
        return web.json_response({"object": "list", "data": data})


def reply_deltas(call: dict[str, Any] | None, pieces: list[str]) -> list[dict[str, Any]]:
    """A stream's deltas after the first: the reply's pieces, or ``call`` named and then its
    arguments in pieces."""
    if call is None:
        return [{"content": p} for p in pieces]
    named = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
    arguments = [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces]
    return [{"tool_calls": [named]}, *arguments]


async def end_stream(
    response: web.StreamResponse,
    chunk: dict[str, Any],
    finish: dict[str, Any],
    body: dict[str, Any],
    usage: dict[str, Any],
) -> web.StreamResponse:
    """A chat stream's last events: the ``finish`` choice, the usage if ``body`` asked for it,
    and [DONE]."""
    await response.write(_event({**chunk, "choices": [finish]}))
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        await response.write(_event({**chunk, "choices": [], "usage": usage}))
    await response.write(b"data: [DONE]\n\n")
    return response


def _tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    """A call of the first tool, unless the conversation already ends with a tool's result."""
    tools, messages = body.get("tools"), body.get("messages")
    if not isinstance(tools, list) or not tools or not isinstance(messages, list):
        return None
    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None
    name = tools[0].get("function", {}).get("name", "tool")
    arguments = '{"a": 4, "b": 6}'
    return {
        "id": "call_" + os.urandom(8).hex(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def providers_settings(tmp_path: Path, toml: str, **environ: str) -> dict[str, Any]:
    """Settings overrides for ``start_gateway`` from a providers file, read as ``serve`` reads it."""
    path = tmp_path / "llmgw.toml"
    path.write_text(toml)
    settings = load_settings({"LLMGW_CONFIG": str(path), **environ})
    return {"providers": settings.providers, "model_aliases": settings.model_aliases}
