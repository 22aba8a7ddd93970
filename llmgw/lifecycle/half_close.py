"""Answering clients that half-close: they send a request, then shut down their write side.

asyncio closes a connection when the peer's FIN arrives unless the protocol keeps it open, and
aiohttp's does not, so such a client got no answer at all. TCP cannot tell a half-close from a client
that left: either is one FIN. So when the FIN arrives while a complete request waits for its answer,
the connection stays open for that answer (and then closes). A moment later the gateway sends the
client an interim ``100 Continue`` (HTTP/1.1 clients must accept 1xx answers they did not ask for,
RFC 9110 §15.2): a client that is gone answers it with a reset, and its request is cancelled as
before. A FIN on an idle connection, or once the answer has begun, closes the connection as before.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

__all__ = ["HalfCloseRequestHandler"]

_PROBE_AFTER_SECONDS = 0.25  # answers quicker than this need no probe at all
_PROBE_EVERY_SECONDS = 0.25
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_TCP_CLOSE = 7  # tcp_info.tcpi_state after the peer's reset (linux/tcp_states.h)


def _reset_by_peer(transport: asyncio.Transport) -> bool:
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)
    except OSError:
        return True
    return bool(state) and state[0] == _TCP_CLOSE


class HalfCloseRequestHandler(RequestHandler):
    """aiohttp's connection protocol, answering a client that half-closed."""

    __slots__ = ("_answered", "_probe", "_probed")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._answered = 0  # requests whose answer was written (aiohttp counts those received)
        self._probe: asyncio.TimerHandle | None = None
        self._probed = False

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answered += 1

    def _awaiting_answer(self) -> bool:
        if self._request_count <= self._answered:
            return False
        request = self._current_request  # None: received, its handler not started yet
        return request is None or (request.content.is_eof() and request.writer.output_size == 0)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        if self.transport is None or not self._awaiting_answer():
            return None  # asyncio closes the connection, as it always did
        self.close()  # no further request on this connection: it closes after this answer
        self._probe = self._loop.call_later(_PROBE_AFTER_SECONDS, self._probe_peer)
        return True

    def _probe_peer(self) -> None:
        self._probe = None
        transport = self.transport
        request = self._current_request
        if transport is None or transport.is_closing() or not self._awaiting_answer():
            return
        if self._probed:
            if _reset_by_peer(transport):
                transport.abort()  # connection_lost: the handler is cancelled (client left)
                return
        elif request is not None and request.version >= HttpVersion11:
            if request.writer.output_size != 0:
                return  # the answer has begun: writing it tells whether the client is there
            transport.write(_CONTINUE)
            self._probed = True
        self._probe = self._loop.call_later(_PROBE_EVERY_SECONDS, self._probe_peer)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        super().connection_lost(exc)
