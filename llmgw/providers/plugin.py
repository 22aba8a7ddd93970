"""The interface of a provider kind, built in or from another package (a plugin).

A kind is an entry point of the group ``llmgw.providers`` naming a :class:`ProviderPlugin`::

    [project.entry-points."llmgw.providers"]
    echo = "llmgw_echo:PLUGIN"

For each ``[[providers]]`` entry with ``kind = "echo"``, llmgw validates the table (the keys every
provider has, plus the keys of the plugin's ``options`` spec, through the providers file's strict
converter) and calls ``factory`` with a :class:`ProviderSetup`; the factory returns a
``llmgw.providers.base.Provider``. docs/plugins.md is the guide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

from llmgw.config.kinds import Capabilities
from llmgw.config.providers_file import Timeouts

if TYPE_CHECKING:
    from llmgw.providers.base import Provider, Retries

__all__ = ["Capabilities", "NoOptions", "ProviderPlugin", "ProviderSetup", "Timeouts"]

OptionsT = TypeVar("OptionsT")


@attrs.frozen
class NoOptions:
    """The options of a kind that has no keys of its own."""


@attrs.frozen
class ProviderSetup(Generic[OptionsT]):
    """One validated ``[[providers]]`` entry, with the gateway's settings already applied: what a
    kind's factory builds its provider from."""

    name: str
    base_url: str  # an http(s) URL without a trailing slash
    api_key: str | None = attrs.field(repr=False)  # read from api_key_env; never log it
    headers: Mapping[str, str] = attrs.field(repr=False)  # sent on every call
    options: OptionsT  # the kind's own keys, as its ``options`` spec
    capabilities: Capabilities  # the kind's defaults with the entry's overrides
    timeouts: Timeouts
    retry: Retries  # the route's retry policy (llmgw.routing.retry.RetryPolicy)
    max_connections: int  # calls in flight at once
    max_response_bytes: int  # largest answer to read (UPSTREAM_MAX_RESPONSE_BYTES)


@attrs.frozen
class ProviderPlugin(Generic[OptionsT]):
    """A provider kind: what its entry point names."""

    factory: Callable[[ProviderSetup[OptionsT]], Provider]
    # An attrs class of the kind's own keys, validated like the rest of the entry: unknown keys are
    # refused, a missing one without a default is "required". Its validators may raise
    # ``llmgw.config.converter.Invalid`` (or use ``check``) to name the key they refuse.
    options: type[OptionsT] = NoOptions  # type: ignore[assignment]
    capabilities: Capabilities = attrs.field(factory=Capabilities)  # defaults; entries override
    summary: str = ""  # one line for ``llmgw providers``
    # The base_url of an entry that sets none, from its options (a kind whose endpoint follows
    # from other keys, as Bedrock's from its region); None: every entry sets base_url.
    default_base_url: Callable[[OptionsT], str] | None = None
