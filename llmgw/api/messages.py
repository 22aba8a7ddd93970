"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API (Claude Code's).

A Messages request is translated to the route's chat completions and runs through the same pipeline
as one (keys, limits, routing and fallbacks, telemetry, the ledger); the answer, its stream and its
errors come back in Anthropic's shapes. ``anthropic-version`` and ``anthropic-beta`` are accepted
and not needed: no beta flag changes the translation, and unknown ones are ignored, not refused.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson
from aiohttp import web

from llmgw.accounting.estimate import estimate_input_tokens
from llmgw.api.body import read_json_object
from llmgw.api.pipeline import Operation, proxy
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import GatewayError
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry import semconv as sc
from llmgw.translation import anthropic
from llmgw.translation.anthropic_stream import MessageStream

__all__ = [
    "MESSAGES",
    "MESSAGES_PATH",
    "AnthropicCodec",
    "count_tokens",
    "create_message",
    "error_json",
]

MESSAGES_PATH = "/v1/messages"


@attrs.frozen
class AnthropicCodec:
    """The ``ApiCodec`` of the Messages API."""

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return anthropic.messages_to_chat(body)

    async def from_chat(self, completion: dict[str, Any], *, request: dict[str, Any]) -> bytes:
        message = anthropic.message_from_chat(
            completion, request=request, message_id=anthropic.new_message_id()
        )
        return orjson.dumps(message)

    def stream_translator(
        self, *, request: dict[str, Any], estimated_input_tokens: int
    ) -> StreamTranslator:
        stop = request.get("stop_sequences")
        return MessageStream(
            model=request.get("model"),
            message_id=anthropic.new_message_id(),
            estimated_input_tokens=estimated_input_tokens,
            stop_sequences=[s for s in stop if isinstance(s, str)]
            if isinstance(stop, list)
            else (),
        )


MESSAGES = Operation(
    name=sc.OPERATION_CHAT,
    validate=anthropic.validate_messages_request,
    complete=lambda provider, call: provider.chat_completion(call),
    codec=AnthropicCodec(),
)


def error_json(error: GatewayError) -> bytes:
    """Every error on these routes, the gateway's own and the provider's: Anthropic's shape."""
    return orjson.dumps(anthropic.error_body(error.status, error.message))


async def create_message(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    return await proxy(request, key, MESSAGES)


async def count_tokens(request: web.Request, key: AuthenticatedKey) -> web.Response:
    """The gateway's own estimate of the request's input tokens; the provider is not asked."""
    _, body = await read_json_object(request)
    anthropic.validate_count_tokens_request(body)
    tokens = estimate_input_tokens(anthropic.messages_to_chat(body))
    return web.Response(
        body=orjson.dumps({"input_tokens": tokens}), content_type="application/json"
    )
