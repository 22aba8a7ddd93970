"""Fast paths through dependencies' private names, each gated on the versions it was verified on.

Everything in llmgw uses its dependencies' public APIs, except the fast paths in this package: one
module per dependency holds every private name llmgw touches in it, and a :class:`FastPath` that
says which versions of that dependency the access was verified against. On any other version, or
when ``LLMGW_PUBLIC_APIS_ONLY`` is true, the public path is taken instead: an upgrade costs speed,
never correctness. :func:`log_fast_paths` states at start, in one line, which fast paths are on.
"""

from __future__ import annotations

import logging
import os
import re
from importlib import metadata

import attrs

from llmgw.config import ConfigError, parse_bool

__all__ = [
    "PUBLIC_APIS_ONLY_VARIABLE",
    "FastPath",
    "fast_paths",
    "log_fast_paths",
    "public_apis_only",
]

PUBLIC_APIS_ONLY_VARIABLE = "LLMGW_PUBLIC_APIS_ONLY"

log = logging.getLogger(__name__)


def public_apis_only() -> bool:
    """Whether the operator (or a test) turned every fast path off."""
    # Read from the environment, not Settings: workers inherit it, and so do tests run with it.
    raw = os.environ.get(PUBLIC_APIS_ONLY_VARIABLE)
    if raw is None:
        return False
    try:
        return parse_bool(raw)
    except ValueError:
        raise ConfigError(PUBLIC_APIS_ONLY_VARIABLE, raw, "true or false") from None


def _release(version: str) -> tuple[int, ...]:
    """``"1.39.1"`` -> ``(1, 39, 1)``; a pre-release or local suffix ends the numbers."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in numbers.group().split(".")) if numbers else ()


@attrs.frozen
class FastPath:
    """A private-name fast path through ``distribution``, verified on ``[lowest, below)``."""

    name: str
    distribution: str
    lowest: tuple[int, ...]
    below: tuple[int, ...]

    def installed(self) -> str | None:
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            return None

    def verified_on(self, version: str) -> bool:
        return self.lowest <= _release(version) < self.below

    def enabled(self) -> bool:
        """Checked where the fast path is chosen (at start), not per call."""
        version = self.installed()
        return not public_apis_only() and version is not None and self.verified_on(version)

    def state(self) -> str:
        if public_apis_only():
            return f"{self.name} off ({PUBLIC_APIS_ONLY_VARIABLE})"
        version = self.installed()
        if version is not None and self.verified_on(version):
            return f"{self.name} on ({self.distribution} {version})"
        verified = ".".join(map(str, self.lowest)) + " to <" + ".".join(map(str, self.below))
        return f"{self.name} off ({self.distribution} {version}, verified {verified})"


def log_fast_paths() -> None:
    """One line at start: which private-name fast paths are on, and why the others are off."""
    log.info("fast paths: %s", "; ".join(path.state() for path in fast_paths()))


def fast_paths() -> tuple[FastPath, ...]:
    """Every private-name fast path llmgw has."""
    # Imported here: each dependency's module imports this one for FastPath.
    from llmgw.compat.aiohttp import CONNECTION_HOOKS
    from llmgw.compat.opentelemetry_exporter_otlp import OTLP_SPAN_EXPORT
    from llmgw.compat.opentelemetry_sdk import LEAN_TRACER, METRIC_READER_HOOK

    return (METRIC_READER_HOOK, LEAN_TRACER, OTLP_SPAN_EXPORT, CONNECTION_HOOKS)
