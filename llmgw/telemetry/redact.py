"""Taking secrets out of text the gateway did not write itself (an exception's message) before it
is logged.

An exception raised by a library can quote what it was given: a URL with its password, a header
with a key, a token it could not parse. What looks like a credential is replaced by ``[redacted]``:

- a gateway key (``llmg_…``), a value after ``Bearer``/``Basic``, and the value of anything named
  a key, token, secret, password or authorization (``api_key=…``, ``"token": "…"``);
- the user and password of a URL (``postgresql://user:pass@host``);
- any run of 24 or more letters, digits, ``-`` and ``_`` that holds a digit: the shape of a
  generated key or token (a provider's key, a hash); identifiers of code and SQL rarely hold one.

The gateway's own secrets (its provider keys, the admin token) are also replaced wherever they
appear, whatever their shape. What is left says what went wrong without any value that could let
someone in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

__all__ = ["REDACTED", "redact"]

REDACTED: Final = "[redacted]"

_GATEWAY_KEY = re.compile(r"llmg_[A-Za-z0-9_\-]*")
_SCHEME_VALUE = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s'\",;]+")
_NAMED_VALUE = re.compile(
    r"(?i)((?:api[_-]?key|x-api-key|token|secret|password|passwd|authorization)[\"']?\s*[:=]\s*"
    r"[\"']?)[^\s'\",;&]+"
)
_URL_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.\-]*://)[^/\s@]+@")
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_\-]{24,}")
_DIGIT = re.compile(r"\d")


def _token_like(match: re.Match[str]) -> str:
    text = match.group(0)
    return REDACTED if _DIGIT.search(text) else text


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with ``secrets`` (the gateway's own, exactly) and every credential-like part
    replaced by ``[redacted]``."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    text = _GATEWAY_KEY.sub(REDACTED, text)
    text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    text = _SCHEME_VALUE.sub(rf"\1\2{REDACTED}", text)
    text = _NAMED_VALUE.sub(rf"\1{REDACTED}", text)
    return _TOKEN_LIKE.sub(_token_like, text)
