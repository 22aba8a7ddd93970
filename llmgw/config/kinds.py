"""The installed provider kinds: entry points of the group ``llmgw.providers``, llmgw's own included.

This registry is how a kind's own keys (its options spec) and default capabilities reach the
configuration: each entry point names a ``llmgw.providers.plugin.ProviderPlugin``, which the
configuration reads as a :class:`Kind`, so it never imports ``llmgw.providers``.

Entry points are read each time a configuration is loaded (at start and on SIGHUP: rare, and a
plugin installed since is found). A kind is imported only when a configuration uses it or
``llmgw providers`` lists it, so a broken plugin stops only the configurations that name it, with
one line saying which and why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = [
    "ENTRY_POINT_GROUP",
    "Capabilities",
    "InstalledKind",
    "Kind",
    "KindError",
    "installed_kinds",
    "load_kind",
]

ENTRY_POINT_GROUP = "llmgw.providers"


@attrs.frozen
class Capabilities:
    """What a provider's deployments accept beyond plain chat completions. The gateway sends a
    feature only to a deployment declared to have it (and says what it left out), because an
    upstream that refuses a parameter fails every request that carries it. A kind declares its
    defaults (``ProviderPlugin.capabilities``); each ``[[providers]]`` entry may override them."""

    reasoning: bool = (
        False  # reasoning_effort / reasoning: chat's effort, Anthropic's thinking mapped
    )
    # A trailing assistant message is continued, not answered with a new turn: a stream broken
    # mid-answer is finished by sending the text already relayed as that message.
    prefill: bool = False
    # It serves POST /responses itself (``responses = "native"``); else Responses become chat.
    native_responses: bool = False
    # It serves POST /messages itself (``messages = "native"``); else Messages become chat.
    native_messages: bool = False

    @classmethod
    def common_to(cls, every: Iterable[Capabilities]) -> Capabilities:
        """What all of ``every`` accept (a route that may fall back to any of them)."""
        every = tuple(every)
        if len(every) == 1:
            return every[0]  # a route of one deployment (most requests): nothing to combine
        return cls(
            **{
                field: all(getattr(c, field) for c in every)
                for field in attrs.fields_dict(Capabilities)
            }
        )


@runtime_checkable
class Kind(Protocol):
    """What an entry point must name: a ``llmgw.providers.plugin.ProviderPlugin``, as the
    configuration reads it (the factory is the providers' business)."""

    @property
    def factory(self) -> Callable[[Any], Any]: ...

    @property
    def options(self) -> type[Any]: ...  # an attrs class of the kind's own keys

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def summary(self) -> str: ...

    @property
    def default_base_url(self) -> Callable[[Any], str] | None: ...  # from the options, or None


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

    def load(self) -> Kind:
        """The kind's plugin; KindError (never the import's traceback) when it cannot be loaded."""
        which = f'the plugin of kind "{self.name}" ({self.entry_point.value}, from {self.source})'
        try:
            plugin = self.entry_point.load()
        except Exception as exc:  # a plugin's import may fail in any way; say so in one line
            raise KindError(f"{which} failed to load: {type(exc).__name__}: {exc}") from None
        if not isinstance(plugin, Kind):
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


def load_kind(name: str) -> Kind:
    """The plugin of kind ``name``; KindError listing the installed kinds if there is none."""
    found = _entry_points()
    if name not in found:
        names = ", ".join(f'"{kind}"' for kind in found) or "none"
        raise KindError(f'no provider kind "{name}" is installed; installed kinds: {names}')
    return InstalledKind.of(found[name]).load()
