"""The one pipeline every proxied operation (chat, embeddings, messages, responses, media) goes
through.

    read the body → validate (→ translate) → admit → route the model → open the observation
    → call the route → answer (→ translate back)

The key and the route are both known right after ``resolve``; the observation finishes exactly once,
whatever the outcome. An :class:`Operation` says what differs between JSON operations; an operation
whose body is not JSON (an upload) or whose answer is not (audio) reads its own body, starts with
:func:`start_call` and calls the provider through :func:`observe_upstream`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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
from llmgw.streaming.summary import CLIENT_CLOSED_REQUEST, StreamSummary
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.genai import ChatObservation, Outcome

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "Operation",
    "UpstreamRequest",
    "forward_upstream_error",
    "observe_upstream",
    "proxy",
    "start_call",
]

T = TypeVar("T")


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
    caller_body, codec = body, operation.codec
    if codec is not None:
        body = codec.to_chat(body)
    # Token counts for every stream: ask for usage even when the caller did not, and hide the
    # usage-only chunk from a caller who did not ask for it.
    hide_usage_chunk = stream and operation.sends_chat and not _caller_asked_for_usage(body)
    if hide_usage_chunk:
        options = body.get("stream_options")
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    sent = orjson.dumps(body) if hide_usage_chunk or codec is not None else raw
    route, call, observation = await start_call(
        request, key, UpstreamRequest(operation.name, model, stream, body, sent)
    )
    translator = (
        codec.stream_translator(
            request=caller_body, estimated_input_tokens=estimate_input_tokens(body)
        )
        if codec is not None and stream
        else None
    )
    translate_errors = codec is not None
    if not stream:
        return await observe_upstream(
            observation,
            functools.partial(_complete, operation, route, call, observation, caller_body),
            translate_errors=translate_errors,
        )
    opened = await observe_upstream(
        observation,
        functools.partial(operation.open_stream, route, call),
        translate_errors=translate_errors,
    )
    if isinstance(opened, web.StreamResponse):
        return opened  # the provider's error, forwarded
    observation.retries = opened.retries
    # From here the relay tells how the stream ended, once, possibly after the caller left.
    return await relay_stream(
        request,
        opened,
        observation,
        hide_usage_chunk=hide_usage_chunk,
        on_end=functools.partial(_finish_stream, observation),
        translator=translator,
    )


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


async def start_call(
    request: web.Request, key: AuthenticatedKey, upstream: UpstreamRequest
) -> tuple[Provider, UpstreamCall, ChatObservation]:
    """Admit, route and open the observation: what every operation shares once its body is read.
    Returns the route, the call to send it, and the observation (which the caller finishes)."""
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
    return route, call, observation


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


def _finish_stream(observation: ChatObservation, summary: StreamSummary) -> None:
    observation.usage = summary.usage
    observation.finish(
        status=summary.status, outcome=summary.outcome, error_type=summary.error_type
    )


async def _complete(
    operation: Operation,
    provider: Provider,
    call: UpstreamCall,
    observation: ChatObservation,
    caller_body: dict[str, Any],
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


async def observe_upstream(
    observation: ChatObservation,
    call: Callable[[], Awaitable[T]],
    *,
    translate_errors: bool,
) -> T | web.Response:
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
