"""Google's Gemini API with an API key as an upstream (``kind = "gemini"``).

The connection pool, timeouts, retries and bounded reads are the OpenAI-compatible adapter's; what
differs is the API. ``base_url`` defaults to ``https://generativelanguage.googleapis.com``; the key
goes in ``x-goog-api-key``. Chat (and so Responses and Messages callers, translated to chat by the
gateway) goes to ``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``,
translated by ``translation.gemini`` (thought signatures ride in tool call ids); embeddings to
``:batchEmbedContents``. Google's errors (``{"error": {"code", "message", "status"}}``) reach a chat
caller as OpenAI's error object with Google's status as its type; a 429 ``RESOURCE_EXHAUSTED`` is
retried or moved on from, and an input over the model's window is the context-length class.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Final
from urllib.parse import quote

import attrs
import orjson

from llmgw.errors import InvalidRequest
from llmgw.providers.base import ChatStream, UpstreamCall, UpstreamResponse, UpstreamStream
from llmgw.providers.json_bodies import answer_document, invalid_answer, with_json_body
from llmgw.providers.openai_compatible import OpenAICompatibleProvider
from llmgw.providers.plugin import Capabilities, NoOptions, ProviderPlugin
from llmgw.providers.sse import SSEScanner, event_data
from llmgw.providers.translated_stream import TranslatedStream
from llmgw.translation.gemini import (
    GeminiChunks,
    completion_from_gemini,
    gemini_error_body,
    gemini_request,
)

__all__ = [
    "GEMINI_CAPABILITIES",
    "PLUGIN",
    "GeminiProvider",
    "GeminiStream",
    "model_segment",
]

_JSON: Final = "application/json"
_SSE: Final = "text/event-stream"
_KEY_REFUSED: Final = b"API_KEY_INVALID"
_NO_MODELS: Final = UpstreamResponse(200, b'{"object":"list","data":[]}', _JSON)
GEMINI_API: Final = "https://generativelanguage.googleapis.com"

# Gemini thinks (thinkingConfig from reasoning_effort); it answers a trailing model turn with a
# new one rather than continuing it, so a broken stream is restarted, not prefilled.
GEMINI_CAPABILITIES: Final = Capabilities(reasoning=True, prefill=False)


class GeminiProvider(OpenAICompatibleProvider):
    """The Gemini API's models; Vertex AI's (``providers.vertex``) differ only in URL and auth."""

    def _credentials(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}

    def _url(self, path: str, model: str | None) -> str:
        return f"{self._base_url}/v1beta/models/{model_segment(model)}{path}"

    def _openai_error(
        self, answer: UpstreamResponse, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        if answer.status == 400 and _KEY_REFUSED in answer.body:
            # The Gemini API refuses a bad key with a 400: the gateway's key, not the caller's.
            self._check_credentials_accepted(401)
        return attrs.evolve(
            answer, body=gemini_error_body(answer.status, answer.body), content_type=_JSON
        )

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        request = gemini_request(orjson.loads(call.body))
        answer = await self._complete(":generateContent", with_json_body(call, request))
        completion = completion_from_gemini(
            answer_document(answer, self.name),
            model=model_segment(call.model),
            created=int(time.time()),
        )
        return attrs.evolve(answer, body=orjson.dumps(completion), content_type=_JSON)

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        body = orjson.loads(call.body)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return await self._stream(call, body, include_usage=include_usage, render=_chat_event)

    async def _stream(
        self,
        call: UpstreamCall,
        body: dict[str, Any],
        *,
        include_usage: bool,
        render: Callable[[dict[str, Any] | bytes], bytes],
        start: bytes = b"",
    ) -> GeminiStream:
        """streamGenerateContent for the chat request ``body``, each chat chunk ``render``ed
        (as chat's SSE, or as another API's events), after ``start``."""
        chunks = GeminiChunks(
            model=model_segment(call.model), created=int(time.time()), include_usage=include_usage
        )
        stream = await super().forward_stream(
            ":streamGenerateContent?alt=sse",
            with_json_body(call, gemini_request(body)),
            accept=_SSE,
        )
        return GeminiStream(stream, chunks, self.name, render=render, start=start)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        request = orjson.loads(call.body)
        model = model_segment(call.model)
        texts = request.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InvalidRequest("input: Gemini embeds text: a string or a list of strings.")
        entries: list[dict[str, Any]] = []
        for text in texts:
            entry: dict[str, Any] = {
                "model": f"models/{model}",
                "content": {"parts": [{"text": text}]},
            }
            if isinstance(request.get("dimensions"), int):
                entry["outputDimensionality"] = request["dimensions"]
            entries.append(entry)
        answer = await self._complete(
            ":batchEmbedContents", with_json_body(call, {"requests": entries})
        )
        embeddings = answer_document(answer, self.name).get("embeddings")
        if not isinstance(embeddings, list) or len(embeddings) != len(texts):
            raise invalid_answer(self.name)
        result = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": e.get("values")}
                for i, e in enumerate(embeddings)
            ],
            "model": model,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},  # Gemini reports none
        }
        return attrs.evolve(answer, body=orjson.dumps(result), content_type=_JSON)

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        raise self._not_offered(path)

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        raise self._not_offered(path)

    def _not_offered(self, path: str) -> InvalidRequest:
        return InvalidRequest(
            f"The model's provider {self.name} (Gemini) has no {path}.", param="model"
        )

    async def list_models(self, deadline: float) -> UpstreamResponse:
        # Callers reach a Gemini provider through aliases and "provider/model" names.
        return _NO_MODELS


def model_segment(model: str | None) -> str:
    if not model or model in (".", ".."):
        raise InvalidRequest(f"{model!r} is not a Gemini model name.", param="model")
    return quote(model.removeprefix("models/"), safe="")


def _chat_event(chunk: dict[str, Any] | bytes) -> bytes:
    return b"data: " + (chunk if isinstance(chunk, bytes) else orjson.dumps(chunk)) + b"\n\n"


class GeminiStream(TranslatedStream):
    """streamGenerateContent's SSE answers read as chat completion chunks, each rendered as the
    caller's API has it. A stream that ends before an answer with a finish reason is a broken one
    (the route may continue it)."""

    def __init__(
        self,
        upstream: ChatStream,
        chunks: GeminiChunks,
        provider: str,
        *,
        render: Callable[[dict[str, Any] | bytes], bytes],
        start: bytes,
    ) -> None:
        super().__init__(upstream, provider)
        self._chunks = chunks
        self._render = render
        self._start = start

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        scanner = SSEScanner()
        async for data in self._upstream.chunks():
            out: list[bytes] = [self._start] if self._start else []
            self._start = b""
            for event in scanner.feed(data):
                payload = event_data(event)
                if payload is None:
                    continue
                try:
                    document = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    out.append(event)  # the relay's observer counts and logs what it cannot read
                    continue
                if isinstance(document, dict) and isinstance(document.get("error"), dict):
                    raise self.interrupted(
                        f"ended the stream with an error: {document['error'].get('message')}"
                    )
                if not isinstance(document, dict):
                    continue
                out.extend(self._render(chunk) for chunk in self._chunks.feed(document))
            if out:
                yield b"".join(out)
        if not self._chunks.finished:
            raise self.interrupted("ended the stream before the answer was complete")


PLUGIN: Final[ProviderPlugin[NoOptions]] = ProviderPlugin(
    factory=GeminiProvider.from_setup,
    capabilities=GEMINI_CAPABILITIES,
    summary="Google's Gemini API with an API key (generateContent; thought signatures kept)",
    default_base_url=lambda options: GEMINI_API,
)
