"""aiohttp's private names: the serving connection's hooks of ``lifecycle.runner``.

aiohttp's public API builds each connection's ``RequestHandler`` itself and offers no hook into
it. On the versions verified here, :func:`app_runner` makes every connection an
:class:`_RequestHandler` (through the runner's ``_make_server`` and the server's ``_loop`` and
``_kwargs``), which

- answers a request aiohttp's parser refused with the caller's ``invalid_http`` answer
  (``lifecycle.invalid_http``: a JSON 400 that quotes nothing, logged as a refusal) instead of
  aiohttp's plain-text 400 that quotes the offending line, and
- counts connections as they open and close in the caller's ``connections`` (``lifecycle``'s
  ``OpenFiles``), so a burst of connections is seen before its next reading of the open
  descriptors.

Elsewhere it is aiohttp's own ``AppRunner``: parse errors get aiohttp's answer (and its log line),
and the open files guard sees new connections at its next reading, at most ``SAMPLE_SECONDS`` late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from llmgw.compat import FastPath

__all__ = ["CONNECTION_HOOKS", "ConnectionCount", "app_runner"]

CONNECTION_HOOKS = FastPath("connection-hooks", "aiohttp", (3, 14), (3, 15))


class ConnectionCount(Protocol):
    """Told of each serving connection as it opens and closes."""

    def connection_made(self) -> None: ...

    def connection_lost(self) -> None: ...


def app_runner(
    app: web.Application,
    *,
    invalid_http: Callable[[int], web.StreamResponse],
    connections: ConnectionCount,
    **kwargs: Any,
) -> web.AppRunner:
    """An ``AppRunner`` for ``app`` (``kwargs`` as ``AppRunner`` takes them); with the connection
    hooks where ``CONNECTION_HOOKS`` is enabled: ``invalid_http(status)`` answers a request the
    parser refused, ``connections`` counts them."""
    if not CONNECTION_HOOKS.enabled():
        return web.AppRunner(app, **kwargs)
    # The server passes its keyword arguments on to each connection's _RequestHandler.
    return _Runner(app, invalid_http=invalid_http, connections=connections, **kwargs)


class _RequestHandler(RequestHandler):
    __slots__ = ("_connections", "_invalid_http")

    def __init__(
        self,
        *args: Any,
        invalid_http: Callable[[int], web.StreamResponse],
        connections: ConnectionCount,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._invalid_http = invalid_http
        self._connections = connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connections.connection_made()
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._connections.connection_lost()
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, HttpProcessingError):  # the parser's: the request is not valid HTTP
            return self._invalid_http(status)
        return super().handle_error(request, status, exc, message)


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; its connections are _RequestHandlers
        return server
