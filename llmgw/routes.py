"""The route table, and the short list of routes that need no key (everything else does)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw import app_keys
from llmgw.api import chat, embeddings, health, media, messages, models, openapi, responses
from llmgw.api.body_memory import BodyLimit
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.config import Settings
from llmgw.errors import AuthenticationFailed
from llmgw.middleware import ADMITS_ITSELF

__all__ = ["PUBLIC_PATHS", "add_routes", "body_limits", "protected"]

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})

ProtectedHandler = Callable[[web.Request, AuthenticatedKey], Awaitable[web.StreamResponse]]


def protected(
    handler: ProtectedHandler, *, admits_itself: bool = False
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that is only ever called with the key the request authenticated with.

    ``admits_itself``: the handler runs the proxy pipeline, which counts the request window
    together with the request's reservations (one round trip instead of two).
    """

    async def with_key(request: web.Request) -> web.StreamResponse:
        key = request.get(app_keys.API_KEY)
        if key is None:
            raise AuthenticationFailed()
        return await handler(request, key)

    setattr(with_key, ADMITS_ITSELF, admits_itself)
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


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics)
    app.router.add_get("/openapi.json", openapi.openapi_handler(public_paths=PUBLIC_PATHS))
    app.router.add_post(
        "/v1/chat/completions", protected(chat.chat_completions, admits_itself=True)
    )
    app.router.add_post(
        "/v1/embeddings", protected(embeddings.create_embeddings, admits_itself=True)
    )
    app.router.add_post(
        messages.MESSAGES_PATH, protected(messages.create_message, admits_itself=True)
    )
    app.router.add_post(messages.MESSAGES_PATH + "/count_tokens", protected(messages.count_tokens))
    app.router.add_get("/v1/models", protected(models.list_models))
    app.router.add_post("/v1/responses", protected(responses.create_response, admits_itself=True))
    app.router.add_get("/v1/responses/{response_id}", protected(responses.get_response))
    app.router.add_delete("/v1/responses/{response_id}", protected(responses.delete_response))
    app.router.add_get(
        "/v1/responses/{response_id}/input_items", protected(responses.list_input_items)
    )
    app.router.add_post("/v1/images/generations", protected(media.create_image, admits_itself=True))
    app.router.add_post("/v1/audio/speech", protected(media.create_speech, admits_itself=True))
    app.router.add_post(
        "/v1/audio/transcriptions", protected(media.create_transcription, admits_itself=True)
    )
