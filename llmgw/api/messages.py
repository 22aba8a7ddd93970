"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API (Claude Code's).

A route whose deployments all speak Messages (``Capabilities.native_messages``: ``kind = "anthropic"``) is
sent the request as the caller sent it, with its ``anthropic-version`` and ``anthropic-beta``, and
the answer and every stream event come back unchanged; only the key is the gateway's, and the model
the deployment's when an alias names another one. Any other route is sent the request translated
to chat completions, through the same pipeline as one (keys, limits, routing and fallbacks,
telemetry, the ledger), and the answer, its stream and its errors come back in Anthropic's shapes;
there no beta flag changes the translation, and unknown ones are ignored, not refused.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import orjson
from aiohttp import web

from llmgw import app_keys
from llmgw.accounting.estimate import estimate_input_tokens
from llmgw.accounting.usage import Usage
from llmgw.api.body import read_json_object
from llmgw.api.pipeline import (
    Exchange,
    Operation,
    UpstreamRequest,
    observe_upstream,
    passed_headers,
    proxy,
    start_call,
)
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.cache.key import MESSAGES as MESSAGES_API
from llmgw.cache.key import NATIVE_MESSAGES as NATIVE_MESSAGES_API
from llmgw.errors import GatewayError
from llmgw.providers.anthropic import PASSED_HEADERS
from llmgw.providers.base import UpstreamCall, UpstreamHTTPError
from llmgw.routing.fallback import Answer, FallbackChain
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry import semconv as sc
from llmgw.translation import anthropic
from llmgw.translation.anthropic_stream import MessageStream, error_event

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
    cache_api=MESSAGES_API,
)


# Forwarded as it came: the raw body (re-encoded only to swap the model, see
# UpstreamCall.with_model) and the provider's events relayed byte for byte.
NATIVE_MESSAGES = Operation(
    name=sc.OPERATION_CHAT,
    validate=anthropic.validate_messages_request,
    complete=lambda provider, call: provider.forward("/messages", call),
    open_stream=lambda provider, call: provider.forward_stream(
        "/messages", call, accept="text/event-stream"
    ),
    sends_chat=False,
    caller_headers=PASSED_HEADERS,
    cache_api=NATIVE_MESSAGES_API,  # kept and replayed as Messages (llmgw.cache.messages)
    stream_error_event=error_event,
    replay_end=b"",  # message_stop ends it
)


def error_json(error: GatewayError) -> bytes:
    """Every error on these routes, the gateway's own and the provider's: Anthropic's shape."""
    return orjson.dumps(anthropic.error_body(error.status, error.message))


async def create_message(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    _, body = await read_json_object(request)
    model, _ = anthropic.validate_messages_request(body)
    native = request.app[app_keys.PROVIDERS].resolve(model).capabilities.native_messages
    return await proxy(request, key, NATIVE_MESSAGES if native else MESSAGES)


async def count_tokens(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    """Asked of the route when its deployments speak Messages (Anthropic counts exactly); else
    the gateway's own estimate of the request's input tokens.

    Admitted as a message is (the key's models, its limits and requests in flight; the middleware
    counted its window), and ended as every request is, with a ledger row that bills nothing:
    counting costs no tokens. Its upstream errors reach the caller but tell the breaker nothing,
    so that counting requests cannot take a deployment away from anyone's messages."""
    raw, body = await read_json_object(request)
    model = anthropic.validate_count_tokens_request(body)
    route, call, exchange = await start_call(
        request,
        key,
        UpstreamRequest(
            sc.OPERATION_COUNT_TOKENS,
            model,
            False,
            body,
            raw,
            produces_output=False,
            caller_headers=passed_headers(request, PASSED_HEADERS),
        ),
    )
    return await observe_upstream(
        exchange,
        functools.partial(_count, route, call, exchange, body),
        translate_errors=False,
    )


async def _count(
    route: FallbackChain, call: UpstreamCall, exchange: Exchange, body: dict[str, Any]
) -> web.Response:
    exchange.record.usage = Usage(input_tokens=0, output_tokens=0, cost_usd=0.0)
    if not route.capabilities.native_messages:
        tokens = estimate_input_tokens(anthropic.messages_to_chat(body))
        return web.Response(
            body=orjson.dumps({"input_tokens": tokens}), content_type="application/json"
        )
    # The route's first deployment that is not down, asked alone and without the breaker.
    routing = route.routing
    deployment = next(
        (d for d in route.deployments if routing.health(d.label).state == "closed"),
        route.deployments[0],
    )
    sent, _omitted = call.for_deployment(deployment)
    exchange.attempt_started(deployment)
    try:
        answer = await deployment.provider.forward("/messages/count_tokens", sent)
    except UpstreamHTTPError as exc:
        exchange.attempt_failed(deployment, str(exc.response.status), exc.response.status)
        raise
    exchange.answered(Answer(deployment, 1, answer))
    return web.Response(body=answer.body, content_type="application/json")
