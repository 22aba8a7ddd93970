"""The one pipeline every proxied operation (chat, embeddings, responses, media) goes through.

    read the body → validate (→ translate) → admit → route the model → open the observation
    → call the route → answer (→ translate back)

The key and the route are both known right after ``resolve``; the observation finishes exactly once,
whatever the outcome. An :class:`Operation` says what differs between JSON operations; an operation
whose body is not JSON (an upload) or whose answer is not (audio) reads its own body and joins at
:func:`observed_call`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import orjson
from aiohttp import web
from opentelemetry import propagate, trace

from llmgw import app_keys
from llmgw.accounting.estimate import estimate_input_tokens
from llmgw.accounting.usage import parse_usage
from llmgw.api.body import read_json_object, refuse_control_characters
from llmgw.api.codec import ApiCodec
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import GatewayError, ProviderError, UpstreamUnavailable
from llmgw.providers.base import (
    ChatStream,
    Provider,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
)
from llmgw.streaming.relay import relay_stream
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.genai import ChatObservation, Outcome

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "Answer",
    "Operation",
    "UpstreamRequest",
    "forward_upstream_error",
    "observed_call",
    "proxy",
]

# Status recorded for a request whose client went away before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


@attrs.frozen
class Operation:
    """What one API operation adds to the pipeline."""

    name: str  # gen_ai.operation.name, and the first word of the span name
    validate: Callable[[dict[str, Any]], tuple[str, bool]]  # the body -> (model, stream)
    complete: Callable[[Provider, UpstreamCall], Awaitable[UpstreamResponse]]  # not streamed
    # Another API served through chat completions (or a provider's own dialect of it): the
    # request, answers and errors translated.
    codec: ApiCodec | None = None
    open_stream: Callable[[Provider, UpstreamCall], Awaitable[ChatStream]] = lambda provider, call: (
        provider.stream_chat_completion(call)
    )
    sends_chat: bool = True  # False: the provider is sent another API's body (no stream_options)


def forward_upstream_error(response: UpstreamResponse) -> web.Response:
    """The provider's own status and body, untouched, so clients see exactly what it said."""
    headers = {"Content-Type": response.content_type}
    if response.retry_after is not None:
        headers["Retry-After"] = response.retry_after
    return web.Response(status=response.status, body=response.body, headers=headers)


async def proxy(
    request: web.Request, key: AuthenticatedKey, operation: Operation
) -> web.StreamResponse:
    raw, body = await read_json_object(request)
    model, stream = operation.validate(body)
    caller_body = body
    if operation.codec is not None:
        body = operation.codec.to_chat(body)
        raw = orjson.dumps(body)
    # Token counts for every stream: ask for usage even when the caller did not, and hide the
    # usage-only chunk from a caller who did not ask for it.
    hide_usage_chunk = stream and operation.sends_chat and not _caller_asked_for_usage(body)
    if hide_usage_chunk:
        options = body.get("stream_options")
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        raw = orjson.dumps(body)
    answer: Answer = (
        functools.partial(_stream, request, operation, hide_usage_chunk, caller_body, body)
        if stream
        else functools.partial(_complete, operation, caller_body)
    )
    upstream = UpstreamRequest(
        operation.name, model, stream, body, raw, translate_errors=operation.codec is not None
    )
    return await observed_call(request, key, upstream, answer)


# How an operation calls the route it was given and answers the client.
Answer = Callable[[Provider, UpstreamCall, ChatObservation], Awaitable[web.StreamResponse]]


@attrs.frozen
class UpstreamRequest:
    """What an operation sends once its body is read and checked."""

    operation: str  # gen_ai.operation.name
    model: str
    stream: bool
    fields: dict[str, Any]  # the request's fields, for the span's request attributes
    body: bytes  # what is sent
    content_type: str = "application/json"
    encode_for_model: Callable[[str], bytes] | None = None  # for bodies that are not JSON
    translate_errors: bool = False  # provider errors in the route's own shape (ProviderError)


async def observed_call(
    request: web.Request, key: AuthenticatedKey, upstream: UpstreamRequest, answer: Answer
) -> web.StreamResponse:
    """Admit, route, observe and call: what every operation shares once its body is read."""
    refuse_control_characters(upstream.model)
    await request.app[app_keys.POLICY].admit(key, upstream.model)
    route = request.app[app_keys.PROVIDERS].resolve(upstream.model)
    telemetry = request.app[app_keys.TELEMETRY]
    observation = ChatObservation.start(
        telemetry.tracer,
        telemetry.instruments,
        operation=upstream.operation,
        provider_name=route.name,
        server_address=route.server_address,
        server_port=route.server_port,
        provider_reports_cost=route.reports_cost,
        body=upstream.fields,
        model=upstream.model,
        stream=upstream.stream,
        capture_content=telemetry.capture_content,
        request_id=request[app_keys.REQUEST_ID],
        key_id=key.id,
        subject_id=key.subject_id,
        record_sink=request.app[app_keys.USAGE],
    )
    call = attrs.evolve(
        _upstream_call(request, upstream.body, upstream.model, observation),
        content_type=upstream.content_type,
        encode_for_model=upstream.encode_for_model,
    )
    return await _observe_upstream(
        observation,
        functools.partial(answer, route, call, observation),
        translate_errors=upstream.translate_errors,
    )


def _caller_asked_for_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _upstream_call(
    request: web.Request, body: bytes, model: str, observation: ChatObservation
) -> UpstreamCall:
    settings = request.app[app_keys.SETTINGS]
    trace_headers: dict[str, str] = {}
    propagate.inject(trace_headers, context=trace.set_span_in_context(observation.tracer_span))
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_seconds
    return UpstreamCall(
        body=body,
        deadline=deadline,
        trace_headers=trace_headers,
        model=model,
        on_deployment=observation.deployment_tried,
    )


async def _stream(
    request: web.Request,
    operation: Operation,
    hide_usage_chunk: bool,
    caller_body: dict[str, Any],
    body: dict[str, Any],
    provider: Provider,
    call: UpstreamCall,
    observation: ChatObservation,
) -> web.StreamResponse:
    translator = (
        None
        if operation.codec is None
        else operation.codec.stream_translator(
            request=caller_body, estimated_input_tokens=estimate_input_tokens(body)
        )
    )
    upstream = await operation.open_stream(provider, call)
    observation.retries = upstream.retries
    return await relay_stream(
        request, upstream, observation, hide_usage_chunk=hide_usage_chunk, translator=translator
    )


async def _complete(
    operation: Operation,
    caller_body: dict[str, Any],
    provider: Provider,
    call: UpstreamCall,
    observation: ChatObservation,
) -> web.StreamResponse:
    result = await operation.complete(provider, call)
    observation.retries = result.retries
    answered_by = observation.metric_attributes[sc.GEN_AI_PROVIDER_NAME]
    try:
        document = orjson.loads(result.body)
    except orjson.JSONDecodeError:
        raise UpstreamUnavailable(
            f"{answered_by} answered with a body that is not JSON.",
            code="upstream_invalid_response",
        ) from None
    if not isinstance(document, dict):
        raise UpstreamUnavailable(
            f"{answered_by} answered with an unexpected JSON value.",
            code="upstream_invalid_response",
        )
    observation.note_document(document)
    observation.usage = parse_usage(document, with_cost=observation.provider_reports_cost)
    observation.finish(status=result.status, outcome=Outcome.COMPLETED)
    if operation.codec is not None:
        answer = operation.codec.from_chat(document, request=caller_body)
        return web.Response(status=result.status, body=answer, content_type="application/json")
    return web.Response(
        status=result.status, body=result.body, headers={"Content-Type": result.content_type}
    )


async def _observe_upstream(
    observation: ChatObservation,
    call: Callable[[], Awaitable[web.StreamResponse]],
    *,
    translate_errors: bool,
) -> web.StreamResponse:
    """Run ``call``; finish the observation on any failure it raises (success finishes itself).

    A provider's error passes through as it is, or (``translate_errors``) as a ProviderError the
    error middleware renders in the route's own error shape.
    """
    try:
        return await call()
    except UpstreamHTTPError as exc:
        observation.retries = exc.response.retries
        observation.finish(
            status=exc.response.status, outcome=Outcome.FAILED, error_type=str(exc.response.status)
        )
        if translate_errors:
            response = exc.response
            raise ProviderError.from_answer(
                response.status, response.body, retry_after=response.retry_after
            ) from None
        return forward_upstream_error(exc.response)
    except GatewayError as exc:
        observation.finish(status=exc.status, outcome=Outcome.FAILED, error_type=exc.error_kind)
        raise
    except asyncio.CancelledError:
        observation.finish(
            status=CLIENT_CLOSED_REQUEST, outcome=Outcome.CANCELLED, error_type="cancelled"
        )
        raise
