"""The gateway's one middleware: everything every request goes through before and after its
handler, in one coroutine.

In order: the request counted in its configuration's generation (a reload closes replaced
providers once their requests end), its id and SERVER span, its error shape, the open-files guard,
authentication (deny by default), its body allowance and its admission (the limits' ticket); after the handler,
whatever it raised rendered as a JSON error, the span ended, the request's metric and a refusal's
log line. One frame instead of a chain of six middlewares: each layer of a chain is a coroutine
that every resumption of the request passes through, and each kept its own state in the request.
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
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.body_memory import BodyLimits
from llmgw.errors import (
    AuthenticationFailed,
    GatewayError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProviderError,
)
from llmgw.key_format import KEY_MARKER, PREFIX_LENGTH, key_prefix
from llmgw.lifecycle.open_files import open_files_refusal
from llmgw.lifecycle.reload import RequestGenerations
from llmgw.streaming.summary import CLIENT_CLOSED_REQUEST
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.logs import REQUEST_ID
from llmgw.telemetry.refusals import Refusal, RefusalLog
from llmgw.telemetry.runtime import Telemetry

__all__ = [
    "OMITTED_PARAMS_HEADER",
    "ErrorRenderer",
    "add_response_headers",
    "gateway_middleware",
]

log = logging.getLogger(__name__)

OMITTED_PARAMS_HEADER = "llmgw-omitted-params"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# The body of an error in the shape of the API a route serves (OpenAI's is GatewayError's own).
ErrorRenderer = Callable[[GatewayError], bytes]
# The response whose headers went out while the handler still ran (a stream).
_HEADERS_SENT = web.RequestKey("headers_sent", web.StreamResponse)


# Request ids need to be unique, not secret: 128 bits from a generator seeded once from the OS
# cost a fraction of reading os.urandom for every request (as the OTel SDK makes its span ids).
_request_ids = random.Random(secrets.randbits(128))
os.register_at_fork(after_in_child=lambda: _request_ids.seed(secrets.randbits(128)))


def _new_request_id() -> str:
    return f"{_request_ids.getrandbits(128):032x}"


def _route_template(matched: web.AbstractRoute) -> str:
    resource = matched.resource
    return resource.canonical if resource is not None else "unmatched"


def gateway_middleware(
    *,
    telemetry: Telemetry,
    refusals: RefusalLog,
    generations: RequestGenerations,
    body_limits: BodyLimits,
    public_paths: Collection[str] = frozenset(),
    public_prefixes: tuple[str, ...] = (),
    admitting: Collection[Handler] = frozenset(),
    renderers: Sequence[tuple[str, ErrorRenderer]] = (),
) -> Middleware:
    """The middleware of every request (see the module's docstring for what it does in turn).

    - Request id: the caller's ``X-Request-Id`` if sane, else a new one; the SERVER span
      continues the caller's trace and is current while the handler runs.
    - Errors: every failure becomes a JSON error, in OpenAI's shape or that of the first of
      ``renderers`` (path prefix, renderer) whose prefix the path is under; nothing leaks a
      traceback. A caller that hung up (a connection reset while its answer was written) is no
      error: it is counted and the response ends as it is (raised on, aiohttp's server logged
      each at ERROR with a traceback: hundreds of lines when many clients left at once).
    - Keys: every route outside ``public_paths``/``public_prefixes`` needs one.
    - Bodies: each request gets its route's limit and a share of the memory all bodies may hold
      (``body_limits``), released when its handler returns.
    - Admission: the key's ticket (``LimitPolicy.admit``, the one place that admits), which
      counts the request window; for a handler of ``admitting`` (routes that reserve the model's
      limits on the ticket once they read the body) a key that reserves limits counts it
      together with its reservations, in one round trip.
    """
    tracer, instruments = telemetry.tracer, telemetry.instruments

    @web.middleware
    async def impl(request: web.Request, handler: Handler) -> web.StreamResponse:
        generation = generations.enter()
        started = time.perf_counter()
        offered = request.headers.get("X-Request-Id", "")
        request_id = offered if _SANE_REQUEST_ID.fullmatch(offered) else _new_request_id()
        request[app_keys.REQUEST_ID] = request_id
        id_token = REQUEST_ID.set(request_id)
        # Read once: the template names the request, the handler says how it is admitted.
        matched = request.match_info.route
        route = _route_template(matched)
        span = tracer.start_span(
            f"{request.method} {route}",
            context=propagate.extract(request.headers),
            kind=SpanKind.SERVER,
            attributes={
                sc.HTTP_REQUEST_METHOD: request.method,
                sc.HTTP_ROUTE: route,
                sc.LLMGW_REQUEST_ID: request_id,
            },
        )
        # Current for the handler (log lines name its trace); ended here, whatever happens.
        span_token = context.attach(trace.set_span_in_context(span))
        path = request.path
        renderer = _renderer(path, renderers)
        key: AuthenticatedKey | None = None
        refused_key: str | None = None  # the prefix of a gateway key authentication refused
        answered: GatewayError | None = None  # the error the gateway answered with
        status = 500
        response: web.StreamResponse
        try:
            try:
                app = request.app
                # In the caller's API's shape, before any work.
                refusal = open_files_refusal(app, path)
                if refusal is not None:
                    answered, response = refusal, _render(refusal, renderer)
                    response.force_close()  # its descriptor is what is short
                else:
                    if not (path in public_paths or path.startswith(public_prefixes)):
                        presented = _presented_key(request)
                        try:
                            if presented is None:
                                raise AuthenticationFailed()
                            key = await app[app_keys.AUTHENTICATOR].authenticate(presented)
                        except AuthenticationFailed:
                            instruments.auth_failures.add(1)
                            refused_key = _gateway_key_prefix(presented)
                            raise
                        request[app_keys.API_KEY] = key
                    allowance = request[app_keys.BODY_ALLOWANCE] = body_limits.allowance(path)
                    try:
                        if key is not None:
                            # The one admission: the handlers of ``admitting`` reserve the
                            # model's limits on its ticket once they have read the body.
                            request[app_keys.TICKET] = await app[app_keys.LIMITS].admit(
                                key, reserving=matched.handler in admitting
                            )
                        response = await handler(request)
                    finally:
                        allowance.release()
            except GatewayError as error:
                answered, response = error, _render(error, renderer)
            except web.HTTPException as exc:
                answered = _http_error(request, exc)
                response = _render(answered, renderer)
            except ConnectionResetError:
                transport = request.transport
                if transport is not None and not transport.is_closing():
                    # Some other connection's reset, not the caller's.
                    answered, response = _unexpected(request, renderer)
                else:
                    instruments.client_connection_resets.add(1)
                    # aiohttp finishes either quietly: the transport is gone, so nothing more is
                    # written.
                    response = request.get(_HEADERS_SENT) or web.Response(
                        status=CLIENT_CLOSED_REQUEST
                    )
            except web.RequestPayloadError:
                raise
            except Exception:
                answered, response = _unexpected(request, renderer)
            status = response.status
            span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status)
            if answered is not None:
                span.set_attribute(sc.ERROR_TYPE, answered.error_kind)
                span.set_status(Status(StatusCode.ERROR, answered.error_kind))
            return response
        finally:
            context.detach(span_token)
            span.end()
            attributes: dict[str, str | int] = {
                sc.HTTP_ROUTE: route,
                sc.HTTP_RESPONSE_STATUS_CODE: status,
            }
            if answered is not None:
                attributes[sc.ERROR_TYPE] = answered.error_kind
                # A provider's own error, re-rendered, is in the request's billing record.
                if not isinstance(answered, ProviderError):
                    refusals.record(
                        Refusal(
                            route,
                            answered.status,
                            answered.error_kind,
                            refused_key if key is None else key.prefix,
                            round((time.perf_counter() - started) * 1000, 3),
                        )
                    )
                    _count_refusal(request, route, answered)
            instruments.requests.add(1, attributes)
            REQUEST_ID.reset(id_token)
            generation.leave()

    return impl


def _renderer(path: str, renderers: Sequence[tuple[str, ErrorRenderer]]) -> ErrorRenderer | None:
    """The error shape of the API ``path`` is under; None: OpenAI's."""
    for prefix, renderer in renderers:
        if path == prefix or path.startswith(prefix + "/"):
            return renderer
    return None


def _render(error: GatewayError, renderer: ErrorRenderer | None) -> web.Response:
    return web.Response(
        status=error.status,
        body=error.body_bytes() if renderer is None else renderer(error),
        content_type="application/json",
        headers=error.headers,
    )


def _http_error(request: web.Request, exc: web.HTTPException) -> GatewayError:
    """What aiohttp raised (no route, a method not allowed, a form body too large) as the
    gateway's own error."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.app[app_keys.SETTINGS].request_body_limit_bytes
        return PayloadTooLarge(
            f"Request body is larger than the limit of {limit} bytes (REQUEST_BODY_LIMIT_BYTES)."
        )
    if isinstance(exc, web.HTTPNotFound):
        return NotFound(f"No route for {request.method} {request.path}.")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(
            f"{request.method} is not allowed on {request.path}; "
            f"use {', '.join(sorted(exc.allowed_methods))}.",
            headers={"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    generic = GatewayError(exc.reason, code=f"http_{exc.status}")
    generic.status = exc.status
    generic.error_type = "invalid_request_error" if exc.status < 500 else "server_error"
    return generic


def _unexpected(
    request: web.Request, renderer: ErrorRenderer | None
) -> tuple[GatewayError | None, web.StreamResponse]:
    """The gateway's own failure (called while handling it): logged, and a 500 if it can be."""
    # The route's template, not the path as sent: nothing the caller chose is logged.
    log.exception(
        "unexpected error while handling %s %s",
        request.method,
        _route_template(request.match_info.route),
    )
    if _HEADERS_SENT in request:
        # A stream failed past its headers: it ends there, as it is (a second response would be
        # written inside its body).
        return None, request[_HEADERS_SENT]
    error = InternalError("The gateway failed unexpectedly; see its logs.")
    return error, _render(error, renderer)


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
    ticket = request.get(app_keys.TICKET)
    if ticket is not None and ticket.window is not None:
        response.headers.update(ticket.window.headers())
    headers = request.get(app_keys.RESPONSE_HEADERS)
    if headers is not None:
        response.headers.update(headers)
    omitted = request.get(app_keys.OMITTED_PARAMS)
    if omitted:
        response.headers[OMITTED_PARAMS_HEADER] = ", ".join(omitted)


def _gateway_key_prefix(token: str | None) -> str | None:
    """A presented token's prefix if it is shaped like a gateway key (the part that is no
    secret); None for anything else, which could be any secret."""
    if token is None or not token.startswith(KEY_MARKER) or len(token) <= PREFIX_LENGTH:
        return None
    return key_prefix(token)


def _presented_key(request: web.Request) -> str | None:
    """``Authorization: Bearer`` (OpenAI's clients), else ``x-api-key`` (Anthropic's)."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer":
            return token.strip() or None
    return request.headers.get("x-api-key", "").strip() or None
