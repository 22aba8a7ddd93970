"""A route and what is known about it, in one record: the router, the middlewares and
/openapi.json all read it, so a route cannot be renamed away from its description.

The records of an application are kept in it by handler (``DESCRIBED``), which is what the
router hands back for every request and every route it lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs
from aiohttp import web
from aiohttp.typedefs import Handler

__all__ = [
    "CONSOLE_PREFIX",
    "DESCRIBED",
    "JSON",
    "Doc",
    "ErrorSet",
    "Handler",
    "Route",
    "add_routes",
    "admitting",
]

# The errors an operation may answer with: every status the gateway or its provider may answer
# (in OpenAI's or Anthropic's shape), the admin API's, or just these statuses (the gateway's own).
ErrorSet = Literal["proxied", "anthropic", "admin"] | tuple[int, ...]

JSON = "application/json"
# Where the operator console is mounted: pages for browsers, so no route under it is an API
# operation (/openapi.json leaves it out).
CONSOLE_PREFIX = "/console"


@attrs.frozen
class Doc:
    """An operation as /openapi.json describes it.

    Schemas are component names (``str``), inline JSON Schema (``dict``), or attrs classes whose
    schema is read from their fields (``type``).
    """

    operation_id: str
    summary: str
    answer: str  # what the success answer is
    content: Mapping[str, str | dict[str, Any]]  # its media types and their schemas
    status: str = "200"
    request: str | type | None = None
    request_media: str = JSON
    request_required: bool = True
    # With an attrs ``request``: a change to any of these fields, none of them required.
    request_fields: tuple[str, ...] = ()
    errors: ErrorSet = ()
    # The response cache may answer it (docs/cache.md): its request controls and the headers
    # that say what the cache did are documented.
    cached: bool = False


@attrs.frozen
class Route:
    method: str
    path: str
    handler: Handler
    doc: Doc
    public: bool = False  # served without a key
    # The handler runs the proxy pipeline, which counts the request window together with the
    # request's reservations (one round trip instead of two): see gateway_middleware.
    admits_itself: bool = False


DESCRIBED: web.AppKey[Mapping[Handler, Route]] = web.AppKey("described_routes")


def add_routes(app: web.Application, routes: Iterable[Route]) -> None:
    """Register ``routes`` on ``app`` (GET routes answer HEAD too) and keep their records."""
    described: dict[Handler, Route] = {}
    for route in routes:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)
        else:
            app.router.add_route(route.method, route.path, route.handler)
        described[route.handler] = route
    app[DESCRIBED] = described


def admitting(routes: Iterable[Route]) -> frozenset[Handler]:
    """The handlers that reserve their model's limits on the request's ticket once they have
    read its body (``Ticket.reserve``), for gateway_middleware's admission."""
    return frozenset(route.handler for route in routes if route.admits_itself)
