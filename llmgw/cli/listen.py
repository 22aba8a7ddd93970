"""The gateway's listening socket, bound before anything else starts.

Binding first turns a port in use or an address this host does not have into one line and exit
status 2 before any database work, instead of a traceback after "listening on" was logged.
"""

from __future__ import annotations

import socket

from llmgw.cli.common import EXIT_CONFIG, CommandError

__all__ = ["bind_listening_socket"]


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening: aiohttp does that when it serves)."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CommandError(f"BIND_ADDR {shown}: {exc.strerror}", EXIT_CONFIG) from None
    try:
        # As aiohttp's own sites do: a restart may bind while old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CommandError(
            f"BIND_ADDR {shown}: cannot listen: {exc.strerror}", EXIT_CONFIG
        ) from None
    return sock
