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

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

from llmgw.providers.retry import RetryPolicy

if TYPE_CHECKING:
    from llmgw.providers.base import Provider

__all__ = ["Capabilities", "NoOptions", "ProviderPlugin", "ProviderSetup", "Timeouts"]

OptionsT = TypeVar("OptionsT")


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


@attrs.frozen
class Timeouts:
    """How long one attempt on a provider may take, and may stay silent, phase by phase (seconds).

    A silent provider is given up at the first phase it overruns, and the route moves on.
    """

    attempt: float  # one attempt: a JSON answer whole, a stream up to its first event
    connect: float  # TCP (and TLS) connection
    first_token: float  # to the first answer byte: a JSON answer's headers, a stream's first event
    stall: float  # between two reads of a stream


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
    retry: RetryPolicy
    max_connections: int  # calls in flight at once
    max_response_bytes: int  # largest answer to read (UPSTREAM_MAX_RESPONSE_BYTES)


@attrs.frozen
class ProviderPlugin(Generic[OptionsT]):
    """A provider kind: what its entry point names."""

    factory: Callable[[ProviderSetup[OptionsT]], Provider]
    # An attrs class of the kind's own keys, validated like the rest of the entry: unknown keys are
    # refused, a missing one without a default is "required". Its validators may raise
    # ``llmgw.config_converter.Invalid`` (or use ``check``) to name the key they refuse.
    options: type[OptionsT] = NoOptions  # type: ignore[assignment]
    capabilities: Capabilities = Capabilities()  # defaults; each entry may override them
    summary: str = ""  # one line for ``llmgw providers``
    # The base_url of an entry that sets none, from its options (a kind whose endpoint follows
    # from other keys, as Bedrock's from its region); None: every entry sets base_url.
    default_base_url: Callable[[OptionsT], str] | None = None
