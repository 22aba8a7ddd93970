"""The caller's say over the cache, in HTTP's own vocabulary (RFC 9111 request directives)."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["TTL_HEADER", "Controls", "read_controls"]

TTL_HEADER = "X-LLMGW-Cache-TTL"


@attrs.frozen
class Controls:
    read: bool = True  # False: no-store or no-cache
    write: bool = True  # False: no-store
    max_age: float | None = None  # only an entry at most this old
    ttl: float | None = None  # store this answer this long (capped by the configured TTL)


_DEFAULT = Controls()


def read_controls(headers: Mapping[str, str]) -> Controls:
    """Unknown directives and malformed numbers are ignored, as HTTP caches do."""
    cache_control, ttl = headers.get("Cache-Control"), headers.get(TTL_HEADER)
    if cache_control is None and ttl is None:
        return _DEFAULT  # what almost every request says
    getall = getattr(headers, "getall", None)  # a request's headers (a multidict)
    if getall is not None:
        # A field on several lines is one list (RFC 9110 5.3): a proxy may split it, and a
        # no-store on the second line must still keep the answer out.
        cache_control = ",".join(getall("Cache-Control", ()))
    read = write = True
    max_age: float | None = None
    for directive in (cache_control or "").split(","):
        name, _, value = directive.strip().partition("=")
        name = name.strip().lower()
        if name == "no-store":
            read = write = False
        elif name == "no-cache":
            read = False
        elif name == "max-age":
            max_age = _seconds(value)
    return Controls(read, write, max_age, _seconds(ttl or ""))


def _seconds(text: str) -> float | None:
    text = text.strip().strip('"')
    return float(text) if text.isdigit() else None
