"""The middleware chain, outermost first: request context, error rendering, authentication, rate limit.

``create_app`` states the order once; each middleware is a factory with keyword-only arguments.
"""

from __future__ import annotations

import logging
import os
import random
import re
import secrets
import time
from collections.abc import Callable, Collection, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from llmgw import app_keys
from llmgw.auth.keys import KEY_MARKER, PREFIX_LENGTH, key_prefix
from llmgw.errors import (
    AuthenticationFailed,
    GatewayError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProviderError,
)
from llmgw.streaming.summary import CLIENT_CLOSED_REQUEST
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.genai import GatewayInstruments
from llmgw.telemetry.logs import REQUEST_ID
from llmgw.telemetry.refusals import Refusal, RefusalLog

__all__ = [
    "OMITTED_PARAMS_HEADER",
    "add_response_headers",
    "auth_middleware",
    "error_middleware",
    "rate_limit_middleware",
    "render_error",
    "request_context_middleware",
]

log = logging.getLogger(__name__)

OMITTED_PARAMS_HEADER = "llmgw-omitted-params"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# The error the gateway answered with (render_error): the span's error.type, the refusal's line.
_ANSWERED_ERROR = web.RequestKey("answered_error", GatewayError)
_REFUSED_KEY_PREFIX = web.RequestKey("refused_key_prefix", str)
# The body of an error in the shape of the API a route serves (OpenAI's is GatewayError's own).
ErrorRenderer = Callable[[GatewayError], bytes]
_ERROR_RENDERER: web.RequestKey[ErrorRenderer] = web.RequestKey("error_renderer")
# The response whose headers went out while the handler still ran (a stream).
_HEADERS_SENT = web.RequestKey("headers_sent", web.StreamResponse)


# Request ids need to be unique, not secret: 128 bits from a generator seeded once from the OS
# cost a fraction of reading os.urandom for every request (as the OTel SDK makes its span ids).
_request_ids = random.Random(secrets.randbits(128))
os.register_at_fork(after_in_child=lambda: _request_ids.seed(secrets.randbits(128)))


def _new_request_id() -> str:
    return f"{_request_ids.getrandbits(128):032x}"


def _route_template(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def request_context_middleware(
    *, tracer: trace.Tracer, instruments: GatewayInstruments, refusals: RefusalLog
) -> Middleware:
    """Request id (accepted if sane, else made), a SERVER span continuing the caller's trace; the
    end of every request: its metric, and the log line of a refusal."""

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        offered = request.headers.get("X-Request-Id", "")
        request_id = offered if _SANE_REQUEST_ID.fullmatch(offered) else _new_request_id()
        request[app_keys.REQUEST_ID] = request_id
        token = REQUEST_ID.set(request_id)
        route = _route_template(request)
        parent = propagate.extract(request.headers)
        status = 500
        span = tracer.start_span(
            f"{request.method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                sc.HTTP_REQUEST_METHOD: request.method,
                sc.HTTP_ROUTE: route,
                sc.LLMGW_REQUEST_ID: request_id,
            },
        )
        # Current for the handler (log lines name its trace); ended here, whatever happens.
        span_token = context.attach(trace.set_span_in_context(span))
        try:
            response = await handler(request)
            status = response.status
            span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status)
            error = request.get(_ANSWERED_ERROR)
            if error is not None:
                span.set_attribute(sc.ERROR_TYPE, error.error_kind)
                span.set_status(Status(StatusCode.ERROR, error.error_kind))
            return response
        finally:
            context.detach(span_token)
            span.end()
            attributes: dict[str, str | int] = {
                sc.HTTP_ROUTE: route,
                sc.HTTP_RESPONSE_STATUS_CODE: status,
            }
            error = request.get(_ANSWERED_ERROR)
            if error is not None:
                attributes[sc.ERROR_TYPE] = error.error_kind
                # A provider's own error, re-rendered, is in the request's billing record.
                if not isinstance(error, ProviderError):
                    refusals.record(
                        Refusal(
                            route,
                            error.status,
                            error.error_kind,
                            _key_prefix(request),
                            round((time.perf_counter() - started) * 1000, 3),
                        )
                    )
                    _count_refusal(request, route, error)
            instruments.requests.add(1, attributes)
            REQUEST_ID.reset(token)

    return impl


def _count_refusal(request: web.Request, route: str, error: GatewayError) -> None:
    """The console's error counts (refusals_by_minute): the gateway's own 4xx on the API routes.
    No provider was called for these, so the usage ledger has no row of them."""
    counts = request.config_dict.get(app_keys.REFUSAL_COUNTS)
    if counts is not None and 400 <= error.status < 500 and route.startswith("/v1/"):
        counts.count(route, error.status, error.error_kind)


async def add_response_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: runs for plain and streamed responses alike, before headers leave."""
    request[_HEADERS_SENT] = response
    request_id = request.get(app_keys.REQUEST_ID)
    if request_id is not None:
        response.headers["X-Request-Id"] = request_id
    decision = request.get(app_keys.RATE_LIMIT)
    if decision is not None:
        response.headers.update(decision.headers())
    headers = request.get(app_keys.RESPONSE_HEADERS)
    if headers is not None:
        response.headers.update(headers)
    omitted = request.get(app_keys.OMITTED_PARAMS)
    if omitted:
        response.headers[OMITTED_PARAMS_HEADER] = ", ".join(omitted)


def _key_prefix(request: web.Request) -> str | None:
    """The prefix of the key the request was authenticated with, else of the gateway key that
    auth_middleware refused (never of an admin token, nor of anything else presented)."""
    if app_keys.API_KEY in request:
        return request[app_keys.API_KEY].prefix
    return request.get(_REFUSED_KEY_PREFIX)


def _gateway_key_prefix(token: str | None) -> str | None:
    """A presented token's prefix if it is shaped like a gateway key (the part that is no
    secret); None for anything else, which could be any secret."""
    if token is None or not token.startswith(KEY_MARKER) or len(token) <= PREFIX_LENGTH:
        return None
    return key_prefix(token)


def render_error(request: web.Request, error: GatewayError) -> web.Response:
    request[_ANSWERED_ERROR] = error
    renderer = request.get(_ERROR_RENDERER)
    return web.Response(
        status=error.status,
        body=error.body_bytes() if renderer is None else renderer(error),
        content_type="application/json",
        headers=error.headers,
    )


def error_middleware(
    *,
    renderers: Sequence[tuple[str, ErrorRenderer]] = (),
    on_caller_left: Callable[[], None] = lambda: None,
) -> Middleware:
    """Every failure becomes a JSON error; nothing leaks a traceback.

    The shape is OpenAI's, or that of the first of ``renderers`` (path prefix, renderer) whose
    prefix the request's path is under: errors raised before the handler (authentication, the
    rate limit) included.

    A caller that hung up (a connection reset while its answer was written) is no error: it is
    counted (``on_caller_left``) and the response ends as it is. Raised on, aiohttp's server
    logged each at ERROR with a traceback: hundreds of lines when many clients left at once.
    """

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        for prefix, renderer in renderers:
            if request.path == prefix or request.path.startswith(prefix + "/"):
                request[_ERROR_RENDERER] = renderer
                break
        try:
            return await handler(request)
        except GatewayError as error:
            return render_error(request, error)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[app_keys.SETTINGS].request_body_limit_bytes
            return render_error(
                request,
                PayloadTooLarge(
                    f"Request body is larger than the limit of {limit} bytes "
                    "(REQUEST_BODY_LIMIT_BYTES)."
                ),
            )
        except web.HTTPNotFound:
            return render_error(request, NotFound(f"No route for {request.method} {request.path}."))
        except web.HTTPMethodNotAllowed as exc:
            return render_error(
                request,
                MethodNotAllowed(
                    f"{request.method} is not allowed on {request.path}; "
                    f"use {', '.join(sorted(exc.allowed_methods))}.",
                    headers={"Allow": ",".join(sorted(exc.allowed_methods))},
                ),
            )
        except web.HTTPException as exc:
            generic = GatewayError(exc.reason, code=f"http_{exc.status}")
            generic.status = exc.status
            generic.error_type = "invalid_request_error" if exc.status < 500 else "server_error"
            return render_error(request, generic)
        except ConnectionResetError:
            transport = request.transport
            if transport is not None and not transport.is_closing():
                return _unexpected(request)  # some other connection's reset, not the caller's
            on_caller_left()
            # aiohttp finishes either quietly: the transport is gone, so nothing more is written.
            return request.get(_HEADERS_SENT) or web.Response(status=CLIENT_CLOSED_REQUEST)
        except web.RequestPayloadError:
            raise
        except Exception:
            return _unexpected(request)

    return impl


def _unexpected(request: web.Request) -> web.StreamResponse:
    """The gateway's own failure (called while handling it): logged, and a 500 if it can be."""
    # The route's template, not the path as sent: nothing the caller chose is logged.
    log.exception("unexpected error while handling %s %s", request.method, _route_template(request))
    if _HEADERS_SENT in request:
        # A stream failed past its headers: it ends there, as it is (a second response would be
        # written inside its body).
        return request[_HEADERS_SENT]
    return render_error(request, InternalError("The gateway failed unexpectedly; see its logs."))


def _presented_key(request: web.Request) -> str | None:
    """``Authorization: Bearer`` (OpenAI's clients), else ``x-api-key`` (Anthropic's)."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer":
            return token.strip() or None
    return request.headers.get("x-api-key", "").strip() or None


def auth_middleware(
    *,
    public_paths: Collection[str],
    public_prefixes: tuple[str, ...] = (),
    instruments: GatewayInstruments,
) -> Middleware:
    """Deny by default: every route outside ``public_paths``/``public_prefixes`` needs a key."""

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in public_paths or request.path.startswith(public_prefixes):
            return await handler(request)
        token = _presented_key(request)
        try:
            if token is None:
                raise AuthenticationFailed()
            authenticator = request.app[app_keys.AUTHENTICATOR]
            request[app_keys.API_KEY] = await authenticator.authenticate(token)
        except AuthenticationFailed:
            instruments.auth_failures.add(1)
            prefix = _gateway_key_prefix(token)
            if prefix is not None:
                request[_REFUSED_KEY_PREFIX] = prefix  # for the refusal's log line
            raise
        return await handler(request)

    return impl


def rate_limit_middleware(*, admitting: Collection[Handler]) -> Middleware:
    """Count the request against its key's window; refuse with 429 and Retry-After when full.

    Requests whose handler is one of ``admitting`` (routes that admit themselves, read from the
    route table once at startup) and whose key reserves limits are counted there instead, in the
    same round trip as their reservations.
    """

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = request.get(app_keys.API_KEY)
        if key is None:
            return await handler(request)
        limits = request.app[app_keys.LIMITS]
        if not (limits.reserves(key) and request.match_info.handler in admitting):
            request[app_keys.RATE_LIMIT] = await limits.hit(key)
        return await handler(request)

    return impl
