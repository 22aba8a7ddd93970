"""What a reverse proxy says about the client, believed only when TRUST_FORWARDED_HEADERS is on.

Behind a TLS-terminating proxy the gateway sees plain HTTP from the proxy's address. With the
setting on, ``X-Forwarded-Proto: https`` or ``Forwarded: proto=https`` means the browser is on
HTTPS (the console's cookie is then ``Secure``), and the last address in ``X-Forwarded-For`` (the
one the proxy itself appended; the ones before it are whatever the client sent) is the client's,
for sign-in throttling. Off, the default, these headers are ignored: any client can send them.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web

__all__ = ["client_address", "is_https"]


def client_address(request: web.Request, *, trust_forwarded: bool) -> str:
    if trust_forwarded:
        appended = ",".join(request.headers.getall("X-Forwarded-For", ())).rsplit(",", 1)[-1]
        try:
            return str(ipaddress.ip_address(appended.strip()))
        except ValueError:
            pass  # not an address: the connection's own peer it is
    return request.remote or "unknown"


def is_https(request: web.Request, *, trust_forwarded: bool) -> bool:
    if request.secure or not trust_forwarded:
        return request.secure
    protos = ",".join(request.headers.getall("X-Forwarded-Proto", ())).split(",")
    if any(proto.strip().lower() == "https" for proto in protos):
        return True
    return any(hop.get("proto", "").lower() == "https" for hop in request.forwarded)
