"""The gateway's route table: every route with its metadata (public or keyed, admits itself or
not, its operation in /openapi.json). Every route needs a key unless its record says public."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw import app_keys
from llmgw.api import chat, embeddings, health, media, messages, models, openapi, responses
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.body_memory import BodyLimit
from llmgw.config import Settings
from llmgw.errors import AuthenticationFailed
from llmgw.route_table import JSON, Doc, Handler, Route

__all__ = ["PUBLIC_PATHS", "body_limits", "gateway_routes", "protected"]

ProtectedHandler = Callable[[web.Request, AuthenticatedKey], Awaitable[web.StreamResponse]]


def protected(handler: ProtectedHandler) -> Handler:
    """A handler that is only ever called with the key the request authenticated with."""

    async def with_key(request: web.Request) -> web.StreamResponse:
        key = request.get(app_keys.API_KEY)
        if key is None:
            raise AuthenticationFailed()
        return await handler(request, key)

    return with_key


def body_limits(settings: Settings) -> tuple[BodyLimit, dict[str, BodyLimit]]:
    """The largest body of every route (the default) and of those that accept more (by path):
    what Anthropic's and OpenAI's own Messages and Responses APIs accept, as long sessions of
    Claude Code and Codex send; a transcription's upload."""
    messages_limit = BodyLimit(settings.messages_body_limit_bytes, "MESSAGES_BODY_LIMIT_BYTES")
    return BodyLimit(settings.request_body_limit_bytes, "REQUEST_BODY_LIMIT_BYTES"), {
        messages.MESSAGES_PATH: messages_limit,
        messages.MESSAGES_PATH + "/count_tokens": messages_limit,  # the same bodies, counted
        "/v1/responses": BodyLimit(
            settings.responses_body_limit_bytes, "RESPONSES_BODY_LIMIT_BYTES"
        ),
        "/v1/audio/transcriptions": BodyLimit(
            settings.audio_upload_limit_bytes, "AUDIO_UPLOAD_LIMIT_BYTES"
        ),
    }


_EVENTS = "text/event-stream"


def gateway_routes() -> tuple[Route, ...]:
    """The table, made once per application (the /openapi.json handler caches its document)."""
    return (
        Route(
            "GET",
            "/healthz",
            health.healthz,
            Doc("healthz", "Liveness; involves no database.", "Alive.", {JSON: "Status"}),
            public=True,
        ),
        Route(
            "GET",
            "/readyz",
            health.readyz,
            Doc(
                "readyz",
                "Readiness: the database answers and its schema is at head.",
                "Ready.",
                {JSON: "Status"},
                errors=(503,),
            ),
            public=True,
        ),
        Route(
            "GET",
            "/metrics",
            health.metrics,
            Doc(
                "metrics",
                "Prometheus text format, when LLMGW_PROMETHEUS=true.",
                "The metrics.",
                {"text/plain": {"type": "string"}},
                errors=(404,),
            ),
            public=True,
        ),
        Route(
            "GET",
            "/openapi.json",
            openapi.openapi_handler(),
            Doc("openapi", "This document.", "OpenAPI 3.1.", {JSON: {"type": "object"}}),
            public=True,
        ),
        Route(
            "POST",
            "/v1/chat/completions",
            protected(chat.chat_completions),
            Doc(
                "createChatCompletion",
                "OpenAI chat completions, as JSON or as server-sent events.",
                "The completion; with stream=true, server-sent events.",
                {JSON: "ChatCompletion", _EVENTS: "StreamEvent"},
                request="ChatCompletionRequest",
                errors="proxied",
                cached=True,
            ),
            admits_itself=True,
        ),
        Route(
            "POST",
            "/v1/embeddings",
            protected(embeddings.create_embeddings),
            Doc(
                "createEmbeddings",
                "OpenAI embeddings.",
                "The embeddings.",
                {JSON: "EmbeddingList"},
                request="EmbeddingsRequest",
                errors="proxied",
                cached=True,
            ),
            admits_itself=True,
        ),
        Route(
            "POST",
            messages.MESSAGES_PATH,
            protected(messages.create_message),
            Doc(
                "createMessage",
                "Anthropic Messages (x-api-key or Bearer), as JSON or as Anthropic's events.",
                "The message; with stream=true, Anthropic's server-sent events.",
                {JSON: "Message", _EVENTS: "StreamEvent"},
                request="MessagesRequest",
                errors="anthropic",
                cached=True,
            ),
            admits_itself=True,
        ),
        Route(
            "POST",
            messages.MESSAGES_PATH + "/count_tokens",
            protected(messages.count_tokens),
            Doc(
                "countMessageTokens",
                "The gateway's estimate of a Messages request's input tokens.",
                "The count.",
                {JSON: "TokenCount"},
                request="CountTokensRequest",
                errors="anthropic",
            ),
        ),
        Route(
            "GET",
            "/v1/models",
            protected(models.list_models),
            Doc(
                "listModels",
                "The provider's model list (cached briefly).",
                "The models.",
                {JSON: "ModelList"},
                errors="proxied",
            ),
        ),
        Route(
            "POST",
            "/v1/responses",
            protected(responses.create_response),
            Doc(
                "createResponse",
                "OpenAI Responses API, as JSON or as server-sent events.",
                "The response; with stream=true, server-sent events.",
                {JSON: "Response", _EVENTS: "ResponseStreamEvent"},
                request="ResponseRequest",
                errors="proxied",
                cached=True,
            ),
            admits_itself=True,
        ),
        Route(
            "GET",
            "/v1/responses/{response_id}",
            protected(responses.get_response),
            Doc(
                "getResponse",
                "A response this key stored.",
                "The response.",
                {JSON: "Response"},
                errors=(404, 503),
            ),
        ),
        Route(
            "DELETE",
            "/v1/responses/{response_id}",
            protected(responses.delete_response),
            Doc(
                "deleteResponse",
                "Delete a response this key stored.",
                "Deleted.",
                {JSON: "ResponseDeleted"},
                errors=(404, 503),
            ),
        ),
        Route(
            "GET",
            "/v1/responses/{response_id}/input_items",
            protected(responses.list_input_items),
            Doc(
                "listResponseInputItems",
                "The input items of a response this key stored.",
                "The items.",
                {JSON: "ResponseItemList"},
                errors=(404, 503),
            ),
        ),
        Route(
            "POST",
            "/v1/images/generations",
            protected(media.create_image),
            Doc(
                "createImage",
                "OpenAI image generation.",
                "The images.",
                {JSON: "ImageList"},
                request="ImageRequest",
                errors="proxied",
            ),
            admits_itself=True,
        ),
        Route(
            "POST",
            "/v1/audio/speech",
            protected(media.create_speech),
            Doc(
                "createSpeech",
                "Text to speech; the audio is streamed as the provider generates it.",
                "The audio (audio/mpeg unless response_format says otherwise).",
                {"audio/*": {"type": "string", "format": "binary"}},
                request="SpeechRequest",
                errors="proxied",
            ),
            admits_itself=True,
        ),
        Route(
            "POST",
            "/v1/audio/transcriptions",
            protected(media.create_transcription),
            Doc(
                "createTranscription",
                "Speech to text from a multipart upload (AUDIO_UPLOAD_LIMIT_BYTES).",
                "The transcript: JSON, or text with response_format=text.",
                {JSON: "Transcription", "text/plain": {"type": "string"}},
                request="TranscriptionRequest",
                request_media="multipart/form-data",
                errors="proxied",
            ),
            admits_itself=True,
        ),
    )


PUBLIC_PATHS = frozenset(route.path for route in gateway_routes() if route.public)
