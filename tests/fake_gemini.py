"""A fake Gemini API and Vertex AI (Gemini models), speaking Google's JSON, checked against the
official google-genai SDK (tests/test_fake_gemini.py).

A real aiohttp server on 127.0.0.1 (the base URL is its root):

- ``POST /v1beta/models/{model}:generateContent`` (and ``/v1/``) / ``:streamGenerateContent?alt=sse`` /
  ``:batchEmbedContents`` with the key in ``x-goog-api-key`` (the Gemini API); the same under
  ``/v1/projects/{project}/locations/{location}/publishers/google/models/`` with
  ``Authorization: Bearer`` a token this fake's ``/token`` endpoint issued and that has not expired
  (Vertex AI). A missing or wrong key is 401/403 ``UNAUTHENTICATED``/``PERMISSION_DENIED``.
- Answers: text split in ``chunks`` streamed answers; with tools, unless the last turn holds a
  ``functionResponse``, a ``functionCall`` of the first function. With ``thinkingConfig`` (budget
  above 0) a thought summary comes first when ``includeThoughts``, every ``functionCall`` part
  carries a ``thoughtSignature``, and a ``functionCall`` sent back in history without the signature
  this fake gave it is refused (400 INVALID_ARGUMENT), as Gemini 3 refuses it. A prompt holding
  ``BLOCKME`` is blocked (``promptFeedback.blockReason: SAFETY``). Usage reports the prompt, the
  candidates, thoughts and (with a system instruction) cached tokens.
- ``POST /token``: OAuth's token endpoint for a service account's signed JWT (google-auth's
  ``token_uri``), issuing a token that expires in ``token_lifetime`` seconds.

Errors are Google's ``{"error": {"code", "message", "status"}}``; tests script them with
:meth:`FakeGemini.fail_next` and cut streams with :meth:`cut_next`.
"""

from __future__ import annotations

import collections
import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import attrs
import orjson
from aiohttp import web

from tests.fake_venice import split_reply
from tests.processes import ServedHere

FAKE_GEMINI_KEY = "AIzaFakeGeminiKey-0c4d1e9f7a"
THOUGHT = "The user greets me; a short greeting back."
THOUGHTS_TOKENS = 12
CACHED_TOKENS = 64
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@attrs.frozen
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


def signature_for(name: str) -> str:
    return "CiQBfake" + hashlib.sha256(b"fake-gemini:" + name.encode()).hexdigest()


def _error(status: int, message: str) -> web.Response:
    document = {
        "error": {
            "code": status,
            "message": message,
            "status": _STATUS_NAMES.get(status, "UNKNOWN"),
        }
    }
    return web.json_response(document, status=status)


class FakeGemini(ServedHere):
    def __init__(self, *, reply: str = "Hello from fake Gemini!", chunks: int = 3) -> None:
        self.reply = reply
        self.chunks = chunks
        self.received: list[Received] = []
        self.tokens: dict[str, float] = {}  # access token → expiry (time.time())
        self.token_lifetime = 3600
        self.token_requests = 0
        self.on_secret: Callable[[str], None] = lambda secret: None  # told each token it issues
        self._failures: collections.deque[tuple[int, str]] = collections.deque()
        self._cuts: collections.deque[int] = collections.deque()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_uri(self) -> str:
        return f"{self.base_url}/token"

    def fail_next(self, status: int, message: str = "Resource has been exhausted.") -> None:
        self._failures.append((status, message))

    def cut_next(self, after_events: int) -> None:
        self._cuts.append(after_events)

    def expire_tokens(self) -> None:
        self.tokens = dict.fromkeys(self.tokens, 0.0)

    def calls(self, method: str) -> list[Received]:
        return [r for r in self.received if r.path.endswith(method)]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{version:v1|v1beta}/models/{model}:{method}", self._gemini_api)
        app.router.add_post(
            "/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:{method}",
            self._vertex,
        )
        app.router.add_post(
            "/v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:{method}",
            self._claude,
        )
        app.router.add_post("/token", self._token)
        return app

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" or not form.get(
            "assertion"
        ):
            return web.json_response({"error": "invalid_grant"}, status=400)
        self.token_requests += 1
        token = "ya29.fake-" + secrets.token_urlsafe(16)
        self.tokens[token] = time.time() + self.token_lifetime
        self.on_secret(token)
        return web.json_response(
            {"access_token": token, "expires_in": self.token_lifetime, "token_type": "Bearer"}
        )

    async def _gemini_api(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("x-goog-api-key") or request.query.get("key")
        if key is None:
            return _error(401, "Method doesn't allow unregistered callers.")
        if key != FAKE_GEMINI_KEY:
            document = {
                "error": {
                    "code": 400,
                    "message": "API key not valid. Please pass a valid API key.",
                    "status": "INVALID_ARGUMENT",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                        }
                    ],
                }
            }
            return web.json_response(document, status=400)
        return await self._serve(request)

    async def _vertex(self, request: web.Request) -> web.StreamResponse:
        refused = await self._vertex_auth(request)
        return refused if refused is not None else await self._serve(request)

    async def _vertex_auth(self, request: web.Request) -> web.Response | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or token not in self.tokens:
            return _error(401, "Request had invalid authentication credentials.")
        if self.tokens[token] <= time.time():
            return _error(401, "Request had invalid authentication credentials. Token expired.")
        return None

    async def _claude(self, request: web.Request) -> web.StreamResponse:
        """Claude on Vertex: Messages bodies with ``anthropic_version: vertex-2023-10-16``."""
        refused = await self._vertex_auth(request)
        if refused is not None:
            return refused
        body = await request.read()
        self.received.append(
            Received(request.path, {k.lower(): v for k, v in request.headers.items()}, body)
        )
        if self._failures:
            return _error(*self._failures.popleft())
        document = orjson.loads(body)
        if document.get("anthropic_version") != "vertex-2023-10-16":
            return _error(400, "anthropic_version: vertex-2023-10-16 is required")
        prompt = max(1, len(orjson.dumps([document.get("system"), document.get("messages")])) // 4)
        if request.match_info["model"] == "count-tokens":
            return web.json_response({"input_tokens": prompt})
        if "model" in document:
            return _error(400, "model: Extra inputs are not permitted")
        usage = {
            "input_tokens": prompt,
            "output_tokens": self.chunks,
            "cache_read_input_tokens": CACHED_TOKENS,
        }
        message = {
            "id": "msg_vrtx_" + secrets.token_hex(6),
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": self.reply}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if request.match_info["method"] == "rawPredict":
            return web.json_response(message)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": start},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            *(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                }
                for piece in split_reply(self.reply, self.chunks)
            ),
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": self.chunks},
            },
            {"type": "message_stop"},
        ]
        for event in events:
            await response.write(
                f"event: {event['type']}\ndata: ".encode() + orjson.dumps(event) + b"\n\n"
            )
        await response.write_eof()
        return response

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(
            Received(request.path, {k.lower(): v for k, v in request.headers.items()}, body)
        )
        if self._failures:
            return _error(*self._failures.popleft())
        document = orjson.loads(body)
        method = request.match_info["method"]
        if method == "predict":  # Vertex's embeddings
            return web.json_response(
                {
                    "predictions": [
                        {
                            "embeddings": {
                                "values": [0.5, float(i)],
                                "statistics": {"token_count": 2.0},
                            }
                        }
                        for i in range(len(document["instances"]))
                    ]
                }
            )
        if method == "countTokens":
            return web.json_response({"totalTokens": max(1, len(orjson.dumps(document)) // 4)})
        if method == "batchEmbedContents":
            return web.json_response(
                {
                    "embeddings": [
                        {"values": [0.25, float(i)]} for i in range(len(document["requests"]))
                    ]
                }
            )
        problem = _problem(document)
        if problem is not None:
            return _error(400, problem)
        answers = self._answers(document)
        if method == "generateContent":
            return web.json_response(_whole(answers))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        cut = self._cuts.popleft() if self._cuts else None
        for sent, answer in enumerate(answers):
            if sent == cut:
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write(b"data: " + orjson.dumps(answer) + b"\r\n\r\n")
        await response.write_eof()
        return response

    def _answers(self, document: dict[str, Any]) -> list[dict[str, Any]]:
        """The streamed answers (the whole one is their parts together)."""
        config = _thinking_config(document)
        thinking = _field(config, "thinkingBudget", 0) > 0
        prompt = max(1, len(orjson.dumps(document.get("contents"))) // 4)
        if "systemInstruction" in document:  # the prompt's count includes its cached part
            prompt += CACHED_TOKENS
        usage: dict[str, int] = {"promptTokenCount": prompt, "candidatesTokenCount": self.chunks}
        if "systemInstruction" in document:
            usage["cachedContentTokenCount"] = CACHED_TOKENS
        if thinking:
            usage["thoughtsTokenCount"] = THOUGHTS_TOKENS
        usage["totalTokenCount"] = prompt + self.chunks + usage.get("thoughtsTokenCount", 0)
        base = {"modelVersion": "gemini-2.5-flash", "responseId": "resp-" + secrets.token_hex(4)}
        if b"BLOCKME" in orjson.dumps(document.get("contents")):
            return [{**base, "promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage}]
        parts: list[list[dict[str, Any]]] = []
        if thinking and _field(config, "includeThoughts", False):
            parts.append([{"text": THOUGHT, "thought": True}])
        declarations = [
            d for t in document.get("tools", []) for d in t.get("functionDeclarations", [])
        ]
        last = document["contents"][-1]["parts"]
        if declarations and not any("functionResponse" in p for p in last):
            call: dict[str, Any] = {
                "functionCall": {"name": declarations[0]["name"], "args": {"city": "Paris"}}
            }
            if thinking:
                call["thoughtSignature"] = signature_for(declarations[0]["name"])
            parts.append([call])
            finish = "STOP"
        else:
            parts.extend([{"text": piece}] for piece in split_reply(self.reply, self.chunks))
            finish = "STOP"
        answers = [
            {**base, "candidates": [{"content": {"role": "model", "parts": p}, "index": 0}]}
            for p in parts
        ]
        answers[-1]["candidates"][0]["finishReason"] = finish
        answers[-1]["usageMetadata"] = usage
        return answers


def _field(document: dict[str, Any], name: str, default: Any) -> Any:
    """A field by its JSON name or its proto name (Google's APIs take both; google-genai sends
    some of each)."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
    return document.get(name, document.get(snake, default))


def _thinking_config(document: dict[str, Any]) -> dict[str, Any]:
    config = _field(document, "generationConfig", {})
    thinking: dict[str, Any] = _field(config, "thinkingConfig", {})
    return thinking


def _whole(answers: list[dict[str, Any]]) -> dict[str, Any]:
    if "candidates" not in answers[0]:
        return answers[0]
    whole = dict(answers[-1])
    parts = [p for a in answers for p in a["candidates"][0]["content"]["parts"]]
    merged: list[dict[str, Any]] = []
    for part in parts:
        if (
            merged
            and "text" in part
            and "text" in merged[-1]
            and part.get("thought") == merged[-1].get("thought")
        ):
            merged[-1] = {**merged[-1], "text": merged[-1]["text"] + part["text"]}
        else:
            merged.append(part)
    whole["candidates"] = [
        {**answers[-1]["candidates"][0], "content": {"role": "model", "parts": merged}}
    ]
    return whole


def _problem(document: dict[str, Any]) -> str | None:
    contents = document.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    thinking = (
        document.get("generationConfig", {}).get("thinkingConfig", {}).get("thinkingBudget", 0) > 0
    )
    for content in contents:
        if content.get("role") not in ("user", "model"):
            return "Please use a valid role: user, model."
        for part in content.get("parts", []):
            call = part.get("functionCall")
            if (
                call is not None
                and thinking
                and part.get("thoughtSignature") != signature_for(call["name"])
            ):
                return (
                    "Function call is missing a thought_signature in functionCall parts. This is "
                    "required for tools to work correctly."
                )
    return None
