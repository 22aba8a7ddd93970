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


def read_controls(headers: Mapping[str, str]) -> Controls:
    """Unknown directives and malformed numbers are ignored, as HTTP caches do."""
    read = write = True
    max_age: float | None = None
    for directive in headers.get("Cache-Control", "").split(","):
        name, _, value = directive.strip().partition("=")
        name = name.strip().lower()
        if name == "no-store":
            read = write = False
        elif name == "no-cache":
            read = False
        elif name == "max-age":
            max_age = _seconds(value)
    return Controls(read, write, max_age, _seconds(headers.get(TTL_HEADER, "")))


def _seconds(text: str) -> float | None:
    text = text.strip().strip('"')
    return float(text) if text.isdigit() else None
