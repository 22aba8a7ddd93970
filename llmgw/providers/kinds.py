"""The installed provider kinds: entry points of the group ``llmgw.providers``, llmgw's own included.

Entry points are read once per process (a plugin installed later needs a restart, not a reload). A
kind is imported only when a configuration uses it or ``llmgw providers`` lists it, so a broken
plugin stops only the configurations that name it, with one line saying which and why.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import attrs

from llmgw.providers.plugin import ProviderPlugin

__all__ = ["ENTRY_POINT_GROUP", "InstalledKind", "KindError", "installed_kinds", "load_kind"]

ENTRY_POINT_GROUP = "llmgw.providers"


class KindError(ValueError):
    """A kind that is not installed, or whose plugin cannot be loaded; the message says which."""


@attrs.frozen
class InstalledKind:
    name: str
    source: str  # the distribution and version that installs it, e.g. "llmgw 0.1.0"
    target: str  # the entry point's "module:attribute"

    @classmethod
    def of(cls, entry: EntryPoint) -> InstalledKind:
        dist = entry.dist
        source = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        return cls(entry.name, source, entry.value)

    def load(self) -> ProviderPlugin[Any]:
        """The kind's plugin; KindError (never the import's traceback) when it cannot be loaded."""
        return _load(self)


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    # Sorted, so listings and messages do not depend on the order distributions were installed in.
    found = entry_points(group=ENTRY_POINT_GROUP)
    return {entry.name: entry for entry in sorted(found, key=lambda e: e.name)}


def installed_kinds() -> tuple[InstalledKind, ...]:
    return tuple(InstalledKind.of(entry) for entry in _entry_points().values())


@functools.cache
def _load(kind: InstalledKind) -> ProviderPlugin[Any]:
    try:
        plugin = _entry_points()[kind.name].load()
    except Exception as exc:  # a plugin's import may fail in any way; say so in one line
        raise KindError(
            f'the plugin of kind "{kind.name}" ({kind.target}, from {kind.source}) failed to '
            f"load: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(plugin, ProviderPlugin):
        raise KindError(
            f'the plugin of kind "{kind.name}" ({kind.target}, from {kind.source}) is a '
            f"{type(plugin).__name__}, not an llmgw.providers.plugin.ProviderPlugin"
        )
    return plugin


def load_kind(name: str) -> ProviderPlugin[Any]:
    """The plugin of kind ``name``; KindError listing the installed kinds if there is none."""
    entry = _entry_points().get(name)
    if entry is None:
        names = ", ".join(f'"{kind}"' for kind in _entry_points()) or "none"
        raise KindError(f'no provider kind "{name}" is installed; installed kinds: {names}')
    return InstalledKind.of(entry).load()
