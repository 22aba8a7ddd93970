"""What the environment's settings (``environment``) and the providers file (``providers_file``)
share: the error an operator sees, URL checking and showing, connection and price bounds.

Its own module so that neither of the two imports the other's internals: ``environment`` reads the
providers file through ``providers_file``, which needs only this.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_CACHE_TTL_SECONDS",
    "MOST_CONNECTIONS",
    "MOST_USD",
    "ConfigError",
    "is_price",
    "parse_url",
    "price_expected",
    "shown_url",
]

# Calls in flight to one provider at once (VENICE_MAX_CONNECTIONS, a provider's max_connections).
# Agent streams hold a connection for minutes, and one process serves 2,000 of them in about
# 120 MiB and 10% of a core, so the default is generous; each open stream also costs about 2 file
# descriptors (see lifecycle.open_files).
DEFAULT_MAX_CONNECTIONS = 2048
MOST_CONNECTIONS = 100_000

# The longest a cached answer may be kept (CACHE_TTL_SECONDS, an alias's cache_ttl_seconds): ten
# years. Redis keeps an entry for a whole number of milliseconds that must fit its clock's 64 bits,
# so an infinite or astronomical TTL would make every store fail (and look like an outage).
MAX_CACHE_TTL_SECONDS = 10 * 365 * 24 * 3600

# The most any price may be, whatever its unit: the dearest models cost well under $1,000 per
# million tokens, so anything past this is a typo (1e308 would make every reservation refuse).
MOST_USD = 10_000
_PRICE_UNITS = (
    ("_per_mtok", "per million tokens"),
    ("_per_mchar", "per million characters"),
    ("_per_second", "per second"),
    ("image_usd", "per image"),
)


def is_price(value: float) -> bool:
    """A price in USD within bounds (NaN is none: every comparison with it is false)."""
    return 0 <= value <= MOST_USD


def price_expected(key: str) -> str:
    """What a price key expects, in its unit: "a price of 0 to 10000 USD per million tokens"."""
    unit = next((unit for suffix, unit in _PRICE_UNITS if key.endswith(suffix)), "")
    return f"a price of 0 to {MOST_USD} USD {unit}".rstrip()


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


def shown_url(raw: str) -> str:
    """``raw`` as a log line or an error may show it: credentials (``user:password@``) and each
    query value (``?key=...``) replaced by ``***``; they may be keys."""
    try:
        parts = urlsplit(raw)
    except ValueError:
        return "(a URL that cannot be parsed; not shown)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(
        f"{name}=***" if sep else "***"
        for name, sep, _ in (item.partition("=") for item in parts.query.split("&"))
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query if parts.query else ""))
