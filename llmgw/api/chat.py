"""POST /v1/chat/completions: validate, route, call the provider, answer as JSON or as SSE."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from opentelemetry import propagate, trace

from llmgw import app_keys
from llmgw.api.body import read_json_object, validate_chat_request
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import GatewayError, UpstreamUnavailable
from llmgw.providers.base import UpstreamCall, UpstreamHTTPError, UpstreamResponse
from llmgw.streaming.relay import relay_stream
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.genai import ChatObservation, Outcome
from llmgw.telemetry.usage import parse_usage

__all__ = ["chat_completions", "forward_upstream_error", "observe_upstream"]

# Status recorded for a request whose client went away before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


def forward_upstream_error(response: UpstreamResponse) -> web.Response:
    """The provider's own status and body, untouched, so clients see exactly what it said."""
    return web.Response(
        status=response.status, body=response.body, headers={"Content-Type": response.content_type}
    )


def _caller_asked_for_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _upstream_call(request: web.Request, body: bytes, observation: ChatObservation) -> UpstreamCall:
    settings = request.app[app_keys.SETTINGS]
    trace_headers: dict[str, str] = {}
    propagate.inject(trace_headers, context=trace.set_span_in_context(observation.tracer_span))
    deadline = asyncio.get_running_loop().time() + settings.request_timeout_seconds
    return UpstreamCall(body=body, deadline=deadline, trace_headers=trace_headers)


async def observe_upstream(
    observation: ChatObservation, call: Callable[[], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Run ``call``; finish the observation on any failure it raises (success finishes itself)."""
    try:
        return await call()
    except UpstreamHTTPError as exc:
        observation.retries = exc.response.retries
        observation.finish(
            status=exc.response.status, outcome=Outcome.FAILED, error_type=str(exc.response.status)
        )
        return forward_upstream_error(exc.response)
    except GatewayError as exc:
        observation.finish(status=exc.status, outcome=Outcome.FAILED, error_type=exc.error_kind)
        raise
    except asyncio.CancelledError:
        observation.finish(
            status=CLIENT_CLOSED_REQUEST, outcome=Outcome.CANCELLED, error_type="cancelled"
        )
        raise


async def chat_completions(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    raw, body = await read_json_object(request)
    model, stream = validate_chat_request(body)
    route = request.app[app_keys.PROVIDERS].resolve(model)
    provider = route.provider
    rewritten = False
    if route.rewrites_model:
        body["model"] = route.upstream_model
        rewritten = True
    # Token counts for every stream: ask for usage even when the caller did not, and hide the
    # usage-only chunk from a caller who did not ask for it.
    hide_usage_chunk = stream and not _caller_asked_for_usage(body)
    if hide_usage_chunk:
        options = body.get("stream_options")
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        rewritten = True
    telemetry = request.app[app_keys.TELEMETRY]
    observation = ChatObservation.start(
        telemetry.tracer,
        telemetry.instruments,
        operation=sc.OPERATION_CHAT,
        provider_name=provider.name,
        server_address=provider.server_address,
        server_port=provider.server_port,
        provider_reports_cost=provider.reports_cost,
        body=body,
        model=model,
        stream=stream,
        capture_content=telemetry.capture_content,
        request_id=request[app_keys.REQUEST_ID],
        key_id=str(key.id),
        subject_id=None if key.subject_id is None else str(key.subject_id),
    )
    call = _upstream_call(request, orjson.dumps(body) if rewritten else raw, observation)

    async def complete() -> web.StreamResponse:
        result = await provider.chat_completion(call)
        observation.retries = result.retries
        try:
            document = orjson.loads(result.body)
        except orjson.JSONDecodeError:
            raise UpstreamUnavailable(
                f"{provider.name} answered with a body that is not JSON.",
                code="upstream_invalid_response",
            ) from None
        if not isinstance(document, dict):
            raise UpstreamUnavailable(
                f"{provider.name} answered with an unexpected JSON value.",
                code="upstream_invalid_response",
            )
        observation.note_document(document)
        observation.usage = parse_usage(document, with_cost=provider.reports_cost)
        observation.finish(status=result.status, outcome=Outcome.COMPLETED)
        return web.Response(
            status=result.status, body=result.body, headers={"Content-Type": result.content_type}
        )

    async def stream_events() -> web.StreamResponse:
        upstream = await provider.stream_chat_completion(call)
        observation.retries = upstream.retries
        return await relay_stream(request, upstream, observation, hide_usage_chunk=hide_usage_chunk)

    return await observe_upstream(observation, stream_events if stream else complete)
