"""Google Vertex AI as an upstream (``kind = "vertex"``): Gemini models, and Anthropic's.

Gemini models speak the Gemini API's JSON (``providers.gemini``, ``translation.gemini``) under
``{endpoint}/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:...``;
Claude models (``claude-...``) speak Messages under ``publishers/anthropic/models/{model}:rawPredict``
and ``:streamRawPredict``, the body without ``model`` and with ``anthropic_version:
vertex-2023-10-16``: a ``/v1/messages`` caller's body is passed through (``anthropic-beta`` as the
header), a chat caller's translated as for ``kind = "anthropic"``. Messages callers of a Gemini
model are translated here, through chat. The endpoint is ``https://{location}-aiplatform.googleapis.com``
(``aiplatform.googleapis.com`` for ``location = "global"``) unless ``endpoint_url`` names another
(Private Service Connect; a test's fake). Each attempt carries ``Authorization: Bearer`` a token of
google-auth's (``providers.google_auth``), fetched again before it expires; a 401 (a token revoked
or expired early) fetches a new one and sends the request once more.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Final

import attrs
import orjson
from aiohttp.typedefs import StrOrURL

from llmgw.accounting.estimate import estimate_input_tokens
from llmgw.config.converter import check
from llmgw.errors import InvalidRequest
from llmgw.providers.anthropic import MessagesAsChat, as_messages_errors
from llmgw.providers.base import ChatStream, UpstreamCall, UpstreamResponse, UpstreamStream
from llmgw.providers.gemini import GeminiProvider, model_segment
from llmgw.providers.google_auth import GoogleToken
from llmgw.providers.json_bodies import (
    answer_document,
    counted_tokens,
    invalid_answer,
    with_json_body,
)
from llmgw.providers.openai_compatible import OpenAICompatibleProvider
from llmgw.providers.plugin import Capabilities, ProviderPlugin, ProviderSetup
from llmgw.translation import anthropic
from llmgw.translation.anthropic_stream import MessageStream
from llmgw.translation.chat_to_messages import chat_to_messages, trims_prefill
from llmgw.translation.gemini import gemini_request
from llmgw.translation.messages_to_chat import ChatChunks, completion_from_message

__all__ = ["ANTHROPIC_VERSION", "PLUGIN", "VertexOptions", "VertexProvider"]

# What Vertex's Claude models take in the body instead of the anthropic-version header.
ANTHROPIC_VERSION: Final = "vertex-2023-10-16"
_JSON: Final = "application/json"
_SSE: Final = "text/event-stream"
# Anthropic's count_tokens on Vertex is a model of its own, under Anthropic's publisher.
_COUNT_TOKENS: Final = "count-tokens"
# Gemini thinks and does not continue a trailing model turn; Messages are served here, passed
# through to Claude models and translated for Gemini's.
VERTEX_CAPABILITIES: Final = Capabilities(reasoning=True, prefill=False, native_messages=True)
_PROJECT: Final = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_LOCATION: Final = re.compile(r"global|[a-z]+-[a-z]+\d+")


def _endpoint(options: VertexOptions) -> str:
    if options.endpoint_url is not None:
        return options.endpoint_url
    if options.location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{options.location}-aiplatform.googleapis.com"


@attrs.frozen
class VertexOptions:
    """The keys of a ``kind = "vertex"`` entry beyond every provider's."""

    project: str = attrs.field(
        validator=check(lambda p: _PROJECT.fullmatch(p) is not None, "a Google Cloud project id")
    )
    location: str = attrs.field(
        default="global",
        validator=check(
            lambda loc: _LOCATION.fullmatch(loc) is not None,
            'a location, "us-central1" or "global"',
        ),
    )
    endpoint_url: str | None = attrs.field(
        default=None,
        validator=check(
            lambda u: u is None or u.startswith(("https://", "http://")), "an http(s) URL"
        ),
    )
    # A service-account key file; Application Default Credentials when not set.
    credentials_file: str | None = None


class VertexProvider(GeminiProvider):
    def __init__(self, *, token: GoogleToken, project: str, location: str, **options: Any) -> None:
        super().__init__(**options)
        self._token = token
        self._publishers = f"/v1/projects/{project}/locations/{location}/publishers/"

    def _url(self, path: str, model: str | None) -> str:
        publisher = "anthropic" if _is_claude(model) or model == _COUNT_TOKENS else "google"
        return f"{self._base_url}{self._publishers}{publisher}/models/{model_segment(model)}{path}"

    def _headers(self, call: UpstreamCall, accept: str) -> dict[str, str]:
        headers = super()._headers(call, accept)
        beta = call.caller_headers.get("anthropic-beta")
        if beta and _is_claude(call.model):
            headers["anthropic-beta"] = beta
        return headers

    _renews_refused_credentials = True  # a token revoked, or the clocks disagree

    async def _authorize(
        self, url: StrOrURL, call: UpstreamCall, headers: Mapping[str, str], *, renew: bool
    ) -> tuple[StrOrURL, Mapping[str, str]]:
        return url, {**headers, "Authorization": f"Bearer {await self._token.token(renew=renew)}"}

    # -- chat: Gemini's API, or Claude's Messages translated ----------------------------------

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        if not _is_claude(call.model):
            return await super().chat_completion(call)
        request = _claude_body(chat_to_messages(orjson.loads(call.body)))
        answer = await self._complete(":rawPredict", with_json_body(call, request))
        completion = completion_from_message(
            answer_document(answer, self.name), created=int(time.time())
        )
        return attrs.evolve(answer, body=orjson.dumps(completion), content_type=_JSON)

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        if not _is_claude(call.model):
            return await super().stream_chat_completion(call)
        body = orjson.loads(call.body)
        options = body.get("stream_options")
        request = {**_claude_body(chat_to_messages(body)), "stream": True}
        stream = await OpenAICompatibleProvider.forward_stream(
            self, ":streamRawPredict", with_json_body(call, request), accept=_SSE
        )
        translator = ChatChunks(
            created=int(time.time()),
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
            trimmed_prefill=trims_prefill(body),
        )
        return MessagesAsChat(stream, self.name, translator)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        """Vertex embeds through ``:predict``, one instance per text, each with its token count."""
        request = orjson.loads(call.body)
        texts = request.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InvalidRequest("input: Vertex AI embeds text: a string or a list of strings.")
        body: dict[str, Any] = {"instances": [{"content": text} for text in texts]}
        if isinstance(request.get("dimensions"), int):
            body["parameters"] = {"outputDimensionality": request["dimensions"]}
        answer = await self._complete(":predict", with_json_body(call, body))
        predictions = answer_document(answer, self.name).get("predictions")
        if not isinstance(predictions, list) or len(predictions) != len(texts):
            raise invalid_answer(self.name)
        data, tokens = [], 0
        for index, prediction in enumerate(predictions):
            embedding = prediction.get("embeddings") if isinstance(prediction, dict) else None
            embedding = embedding if isinstance(embedding, dict) else {}
            data.append(
                {"object": "embedding", "index": index, "embedding": embedding.get("values")}
            )
            statistics = embedding.get("statistics")
            count = statistics.get("token_count") if isinstance(statistics, dict) else None
            tokens += int(count) if isinstance(count, int | float) else 0
        result = {
            "object": "list",
            "data": data,
            "model": call.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return attrs.evolve(answer, body=orjson.dumps(result), content_type=_JSON)

    # -- Messages: Claude's passed through, Gemini's translated -------------------------------

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        body = orjson.loads(call.body)
        with as_messages_errors():
            if path == "/messages/count_tokens":
                return await self._count_tokens(call, body)
            if path != "/messages":
                raise self._not_offered(path)
            if _is_claude(call.model):
                answer = await self._complete(
                    ":rawPredict", with_json_body(call, _claude_body(body))
                )
                return attrs.evolve(answer, content_type=_JSON)
            chat = anthropic.messages_to_chat(body)
            answer = await self.chat_completion(attrs.evolve(call, body=orjson.dumps(chat)))
        message = anthropic.message_from_chat(
            answer_document(answer, self.name), request=body, message_id=anthropic.new_message_id()
        )
        return attrs.evolve(answer, body=orjson.dumps(message), content_type=_JSON)

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        if path != "/messages":
            raise self._not_offered(path)
        body = orjson.loads(call.body)
        with as_messages_errors():
            if _is_claude(call.model):
                request = {**_claude_body(body), "stream": True}
                return await OpenAICompatibleProvider.forward_stream(
                    self, ":streamRawPredict", with_json_body(call, request), accept=_SSE
                )
            chat = anthropic.messages_to_chat(body)
            stop = body.get("stop_sequences")
            events = MessageStream(
                model=body.get("model"),
                message_id=anthropic.new_message_id(),
                estimated_input_tokens=estimate_input_tokens(chat),
                stop_sequences=[s for s in stop if isinstance(s, str)]
                if isinstance(stop, list)
                else (),
            )

            def render(chunk: dict[str, Any] | bytes) -> bytes:
                return b"" if isinstance(chunk, bytes) else events.feed(chunk)

            return await self._stream(
                call, chat, include_usage=True, render=render, start=events.start()
            )

    async def _count_tokens(self, call: UpstreamCall, body: dict[str, Any]) -> UpstreamResponse:
        if _is_claude(call.model):
            # Anthropic's counter on Vertex takes the whole body, its model included.
            counter = attrs.evolve(call, model=_COUNT_TOKENS)
            request = {**body, "model": call.model, "anthropic_version": ANTHROPIC_VERSION}
            answer = await self._complete(":rawPredict", with_json_body(counter, request))
            return attrs.evolve(answer, content_type=_JSON)
        request = gemini_request(anthropic.messages_to_chat(body))
        fields = ("contents", "systemInstruction", "tools")
        answer = await self._complete(
            ":countTokens", with_json_body(call, {k: request[k] for k in fields if k in request})
        )
        return counted_tokens(answer, self.name, "totalTokens")

    def _not_offered(self, path: str) -> InvalidRequest:
        return InvalidRequest(
            f"The model's provider {self.name} (Vertex AI) has no {path}.", param="model"
        )


def _is_claude(model: str | None) -> bool:
    return model is not None and model.startswith("claude")


def _claude_body(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages body as Vertex's Claude takes it: the model is in the URL, the operation says
    whether to stream, the version is in the body."""
    request = {k: v for k, v in body.items() if k not in ("model", "stream")}
    request["anthropic_version"] = ANTHROPIC_VERSION
    return request


def _from_setup(setup: ProviderSetup[VertexOptions]) -> VertexProvider:
    options = setup.options
    token = GoogleToken(provider=setup.name, credentials_file=options.credentials_file)
    return VertexProvider.from_setup(
        setup, token=token, project=options.project, location=options.location
    )


PLUGIN: Final[ProviderPlugin[VertexOptions]] = ProviderPlugin(
    factory=_from_setup,
    options=VertexOptions,
    capabilities=VERTEX_CAPABILITIES,
    summary="Google Vertex AI: Gemini models, and Claude's Messages as sent (google-auth tokens)",
    default_base_url=_endpoint,
)
