"""Anthropic's Messages API as an upstream (``kind = "anthropic"``).

The connection pool, timeouts, retries (529 ``overloaded_error`` among the transient statuses) and
the bounded reads are the OpenAI-compatible adapter's; what differs is the API. ``base_url`` is
what the anthropic SDK takes (``https://api.anthropic.com``) and the calls go under its ``/v1``;
the gateway's key goes as ``x-api-key``, with ``anthropic-version``.

Two ways in:

- ``forward("/messages", ...)``: a Messages body, sent as it is (the native ``/v1/messages`` route,
  and ``/messages/count_tokens``); the caller's ``anthropic-version`` and ``anthropic-beta`` go
  with it, and the answer comes back unchanged.
- ``chat_completion``/``stream_chat_completion``: a chat completions body (a chat or Responses
  caller, or a Messages caller on a route that mixes kinds) translated to Messages, and the answer,
  stream and errors translated back to chat's shapes (``llmgw.translation``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Iterator, Mapping
from typing import Any, Final

import attrs
import orjson

from llmgw.config.converter import check
from llmgw.errors import InvalidRequest, ProviderError, UpstreamUnavailable
from llmgw.providers.base import (
    ChatStream,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
    UpstreamStream,
)
from llmgw.providers.json_bodies import with_json_body
from llmgw.providers.openai_compatible import OpenAICompatibleProvider
from llmgw.providers.plugin import Capabilities, ProviderPlugin, ProviderSetup
from llmgw.providers.sse import SSEScanner, event_data
from llmgw.providers.translated_stream import TranslatedStream
from llmgw.translation.anthropic import error_body
from llmgw.translation.chat_to_messages import chat_to_messages, trims_prefill
from llmgw.translation.messages_to_chat import ChatChunks, chat_error_body, completion_from_message

__all__ = [
    "ANTHROPIC_VERSION",
    "PLUGIN",
    "AnthropicOptions",
    "AnthropicProvider",
    "MessagesAsChat",
    "as_messages_errors",
]

# The version both anthropic SDKs send; a caller's own goes instead when its body is forwarded.
ANTHROPIC_VERSION: Final = "2023-06-01"
# The caller's headers passed on with a forwarded body: they say how to read it.
PASSED_HEADERS: Final = ("anthropic-version", "anthropic-beta")
# What Anthropic's API serves under /v1 for the gateway's routes (models apart).
_MESSAGES_PATHS: Final = frozenset({"/messages", "/messages/count_tokens"})
_JSON: Final = "application/json"
_EVENT_STREAM: Final = "text/event-stream"


# Every current Claude model thinks and continues a trailing assistant message
# (shared/provider-failures.md F3), and Messages is the API itself.
ANTHROPIC_CAPABILITIES: Final = Capabilities(reasoning=True, prefill=True, native_messages=True)


AUTH_SCHEMES: Final = ("x-api-key", "bearer")


@attrs.frozen
class AnthropicOptions:
    """The keys of a ``kind = "anthropic"`` entry beyond every provider's."""

    # How the key is sent: an Anthropic API key as ``x-api-key``; a token (OAuth, or a gateway in
    # front of Anthropic) as ``Authorization: Bearer``, as the anthropic SDK sends its auth_token.
    auth: str = attrs.field(
        default="x-api-key",
        validator=check(lambda scheme: scheme in AUTH_SCHEMES, '"x-api-key" or "bearer"'),
    )


class AnthropicProvider(OpenAICompatibleProvider):
    def __init__(
        self,
        *,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        capabilities: Capabilities = ANTHROPIC_CAPABILITIES,
        auth: str = "x-api-key",
        **options: Any,
    ) -> None:
        self._auth = auth  # read by _credentials, which the base class calls while it starts
        super().__init__(
            base_url=base_url.rstrip("/") + "/v1",
            headers={"anthropic-version": ANTHROPIC_VERSION, **(headers or {})},
            capabilities=capabilities,
            **options,
        )

    def _credentials(self, api_key: str) -> Mapping[str, str]:
        if self._auth == "bearer":
            return super()._credentials(api_key)
        return {"x-api-key": api_key}

    def _url(self, path: str, model: str | None) -> str:
        url = super()._url(path, model)
        # Anthropic lists 20 models a page unless asked for more.
        return url + "?limit=1000" if path == "/models" else url

    def _headers(self, call: UpstreamCall, accept: str) -> dict[str, str]:
        headers = super()._headers(call, accept)
        headers.update(
            (name, value) for name, value in call.caller_headers.items() if name in PASSED_HEADERS
        )
        return headers

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        with _chat_errors():
            answer = await self._complete("/messages", _as_messages(call))
        try:
            message = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            message = None
        if not isinstance(message, dict):
            raise UpstreamUnavailable(
                f"{self.name} answered with a body that is not a Messages answer.",
                code="upstream_invalid_response",
            )
        completion = completion_from_message(message, created=int(time.time()))
        return attrs.evolve(answer, body=orjson.dumps(completion), content_type=_JSON)

    async def stream_chat_completion(self, call: UpstreamCall) -> ChatStream:
        body = orjson.loads(call.body)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        with _chat_errors():
            stream = await self.forward_stream(
                "/messages", _as_messages(call, body), accept=_EVENT_STREAM
            )
        translator = ChatChunks(
            created=int(time.time()),
            include_usage=include_usage,
            trimmed_prefill=trims_prefill(body),
        )
        return MessagesAsChat(stream, self.name, translator)

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        raise self._not_offered("/embeddings")

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        if path not in _MESSAGES_PATHS:
            raise self._not_offered(path)
        return await super().forward(path, call)

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> UpstreamStream:
        if path not in _MESSAGES_PATHS:
            raise self._not_offered(path)
        return await super().forward_stream(path, call, accept=accept)

    def _not_offered(self, path: str) -> InvalidRequest:
        """Said before anything is sent: Anthropic would answer a 404 in its own shape, which a
        caller of another API could not read."""
        return InvalidRequest(
            f"The model's provider {self.name} speaks Anthropic's Messages API, which has no "
            f"{path}.",
            param="model",
        )

    async def list_models(self, deadline: float) -> UpstreamResponse:
        """Anthropic's listing in OpenAI's shape (the gateway's ``/v1/models`` merges them)."""
        answer = await super().list_models(deadline)
        try:
            listing = orjson.loads(answer.body)
        except orjson.JSONDecodeError:
            return answer  # the caller reports a listing it cannot read
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            return answer
        models = [
            {**model, "object": "model", "owned_by": self.name}
            for model in data
            if isinstance(model, dict)
        ]
        return attrs.evolve(answer, body=orjson.dumps({"object": "list", "data": models}))


def _from_setup(setup: ProviderSetup[AnthropicOptions]) -> AnthropicProvider:
    return AnthropicProvider.from_setup(setup, auth=setup.options.auth)


PLUGIN: Final[ProviderPlugin[AnthropicOptions]] = ProviderPlugin(
    factory=_from_setup,
    options=AnthropicOptions,
    capabilities=ANTHROPIC_CAPABILITIES,
    summary="Anthropic's Messages API (/v1/messages forwarded as sent; chat and Responses translated)",
)


def _as_messages(call: UpstreamCall, body: dict[str, Any] | None = None) -> UpstreamCall:
    return with_json_body(call, chat_to_messages(orjson.loads(call.body) if body is None else body))


@contextlib.contextmanager
def _chat_errors() -> Iterator[None]:
    """An Anthropic error answer to a chat body becomes chat's error object, its status and
    message kept (and the route's decision whether to move on)."""
    try:
        yield
    except UpstreamHTTPError as error:
        response = error.response
        translated = attrs.evolve(
            response, body=chat_error_body(response.status, response.body), content_type=_JSON
        )
        raise UpstreamHTTPError(translated, error.decision) from None


@contextlib.contextmanager
def as_messages_errors() -> Iterator[None]:
    """An error answer in OpenAI's shape (another API's, translated by its adapter) given to a
    Messages caller in Anthropic's, its status and message kept."""
    try:
        yield
    except UpstreamHTTPError as error:
        response = error.response
        message = ProviderError.from_answer(
            response.status, response.body, retry_after=None
        ).message
        body = orjson.dumps(error_body(response.status, message))
        raise UpstreamHTTPError(attrs.evolve(response, body=body), error.decision) from None


class MessagesAsChat(TranslatedStream):
    """An Anthropic event stream read as chat completion chunks (also Claude's on Vertex AI)."""

    def __init__(self, upstream: ChatStream, provider: str, translator: ChatChunks) -> None:
        super().__init__(upstream, provider)
        self._translator = translator

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        scanner = SSEScanner()
        async for data in self._upstream.chunks():
            out: list[bytes] = []
            for event in scanner.feed(data):
                payload = event_data(event)
                if payload is None:
                    continue  # a comment, or an event line whose data follows
                try:
                    document = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    out.append(event)  # the relay's observer counts and logs what it cannot read
                    continue
                if not isinstance(document, dict):
                    out.append(event)
                    continue
                for chunk in self._translator.feed(document):
                    encoded = chunk if isinstance(chunk, bytes) else orjson.dumps(chunk)
                    out.append(b"data: " + encoded + b"\n\n")
            if out:
                yield b"".join(out)
