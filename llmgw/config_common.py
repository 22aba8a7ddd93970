"""What the environment's settings (``llmgw.config``) and the providers file
(``llmgw.provider_config``) share: the error an operator sees, URL checking, connection bounds.

Its own module so that neither of the two imports the other's internals: ``config`` reads the
providers file through ``provider_config``, which needs only this.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

__all__ = ["DEFAULT_MAX_CONNECTIONS", "MOST_CONNECTIONS", "ConfigError", "parse_url"]

# Calls in flight to one provider at once (VENICE_MAX_CONNECTIONS, a provider's max_connections).
# Agent streams hold a connection for minutes, and one process serves 2,000 of them in about
# 120 MiB and 10% of a core, so the default is generous; each open stream also costs about 2 file
# descriptors (see lifecycle.open_files).
DEFAULT_MAX_CONNECTIONS = 2048
MOST_CONNECTIONS = 100_000


class ConfigError(Exception):
    """A configuration value is missing or malformed; the message is one line for the operator."""

    def __init__(self, variable: str, value: str | None, expected: str, *, secret: bool = False):
        self.variable = variable
        if value is None:
            shown = "is not set"
        elif secret:
            shown = "has an invalid value (hidden: it is a secret)"
        else:
            shown = f"has invalid value {value!r}"
        super().__init__(f"{variable} {shown}; expected {expected}")


def parse_url(*schemes: str) -> Callable[[str], str]:
    """A parser of URLs with one of ``schemes``; an http(s) URL loses its trailing slashes."""

    def parse(raw: str) -> str:
        parts = urlsplit(raw)
        if parts.scheme not in schemes:
            raise ValueError(raw)
        if not parts.netloc and not (parts.query or parts.path):
            raise ValueError(raw)
        if parts.scheme in ("http", "https") and not parts.hostname:
            raise ValueError(raw)
        return raw.rstrip("/") if parts.scheme in ("http", "https") else raw

    return parse
