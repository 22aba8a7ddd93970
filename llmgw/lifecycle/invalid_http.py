"""Requests that are not valid HTTP get a short JSON error that quotes nothing they sent.

aiohttp's parser refuses a request line or header it cannot read (longer than 8190 bytes, a NUL,
two ``Content-Length``\\ s, TLS on the plain port, ...) before any middleware or route runs. Its own
answer is a plain-text 400 that quotes the offending line: the first 100 bytes of an oversized
``Authorization`` header, the caller's key among them, went back in the body. This answer is
OpenAI's error shape, the same for every such request; the connection is closed after it, as
aiohttp does, and the refusal is logged like every other (route ``invalid_http``).
"""

from __future__ import annotations

from aiohttp import web

from llmgw.errors import InvalidRequest
from llmgw.telemetry.refusals import Refusal, RefusalLog

__all__ = ["ROUTE", "invalid_http_answer"]

ROUTE = "invalid_http"  # the refusal's route: the request line may not even have been read
_ERROR = InvalidRequest(
    "The request is not valid HTTP: a request line or header that is malformed or longer than "
    "8190 bytes, or a body whose framing is broken.",
    code="invalid_http",
)


def invalid_http_answer(status: int, refusals: RefusalLog) -> web.Response:
    """The answer to a request aiohttp's parser refused with ``status`` (its 400)."""
    refusals.record(Refusal(ROUTE, status, _ERROR.error_kind, key_prefix=None))
    response = web.Response(
        status=status, body=_ERROR.body_bytes(), content_type="application/json"
    )
    response.force_close()
    return response
