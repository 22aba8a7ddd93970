"""The installed provider kinds: entry points of the group ``llmgw.providers``, llmgw's own included.

Entry points are read each time a configuration is loaded (at start and on SIGHUP: rare, and a
plugin installed since is found). A kind is imported only when a configuration uses it or
``llmgw providers`` lists it, so a broken plugin stops only the configurations that name it, with
one line saying which and why.
"""

from __future__ import annotations

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
    entry_point: EntryPoint = attrs.field(repr=False)

    @classmethod
    def of(cls, entry: EntryPoint) -> InstalledKind:
        dist = entry.dist
        source = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        return cls(entry.name, source, entry)

    def load(self) -> ProviderPlugin[Any]:
        """The kind's plugin; KindError (never the import's traceback) when it cannot be loaded."""
        which = f'the plugin of kind "{self.name}" ({self.entry_point.value}, from {self.source})'
        try:
            plugin = self.entry_point.load()
        except Exception as exc:  # a plugin's import may fail in any way; say so in one line
            raise KindError(f"{which} failed to load: {type(exc).__name__}: {exc}") from None
        if not isinstance(plugin, ProviderPlugin):
            raise KindError(
                f"{which} is a {type(plugin).__name__}, "
                "not an llmgw.providers.plugin.ProviderPlugin"
            )
        return plugin


def _entry_points() -> dict[str, EntryPoint]:
    # Sorted, so listings and messages do not depend on the order distributions were installed in.
    found = entry_points(group=ENTRY_POINT_GROUP)
    return {entry.name: entry for entry in sorted(found, key=lambda e: e.name)}


def installed_kinds() -> tuple[InstalledKind, ...]:
    return tuple(InstalledKind.of(entry) for entry in _entry_points().values())


def load_kind(name: str) -> ProviderPlugin[Any]:
    """The plugin of kind ``name``; KindError listing the installed kinds if there is none."""
    found = _entry_points()
    if name not in found:
        names = ", ".join(f'"{kind}"' for kind in found) or "none"
        raise KindError(f'no provider kind "{name}" is installed; installed kinds: {names}')
    return InstalledKind.of(found[name]).load()
