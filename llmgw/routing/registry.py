"""Which deployments serve a model name, and building providers from settings.

A name is resolved in this order: a configured alias (its deployments, in order); ``provider/model``
(that provider, asked for ``model``); anything else goes to the first provider, unchanged. The router
never needs to know a provider's kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from llmgw.config import ConfigError, Settings
from llmgw.config.kinds import KindError, load_kind
from llmgw.config.providers_file import Cooldown, ModelAlias, ProviderSpec
from llmgw.limits.caps import AccountCap
from llmgw.providers.base import Deployment, Provider
from llmgw.providers.openai_compatible import OpenAICompatibleProvider
from llmgw.providers.plugin import ProviderSetup
from llmgw.providers.pool import ConnectionPool
from llmgw.routing.fallback import FallbackChain
from llmgw.routing.policy import RoutingPolicy
from llmgw.routing.retry import RetryPolicy

__all__ = ["ProviderBuildError", "ProviderRegistry", "build_registry", "close_providers"]

# Routes of names no alias has, made once each (not for every request); at most this many are
# kept, since callers choose the names.
_RESOLVED_MAX = 1024


class ProviderRegistry:
    """``routing`` outlives reloads: a deployment that was down is still known to be down."""

    def __init__(
        self,
        providers: Sequence[Provider],
        aliases: Sequence[ModelAlias] = (),
        *,
        cooldowns: Mapping[str, Cooldown] | None = None,
        caps: Mapping[str, AccountCap] | None = None,
        routing: RoutingPolicy | None = None,
    ) -> None:
        if not providers:
            raise ValueError("at least one provider is required")
        self.routing = routing or RoutingPolicy()
        self._use(providers, aliases, cooldowns or {}, caps or {})

    def _use(
        self,
        providers: Sequence[Provider],
        aliases: Sequence[ModelAlias],
        cooldowns: Mapping[str, Cooldown],
        caps: Mapping[str, AccountCap],
    ) -> None:
        self.providers = tuple(providers)
        self._by_name = {provider.name: provider for provider in providers}
        self._alias_specs = tuple(aliases)
        self._cooldowns = cooldowns
        self._caps = caps
        self.routing.configure(cooldowns, caps)
        self.aliases: Mapping[str, FallbackChain] = {
            alias.alias: FallbackChain(
                [Deployment(self._by_name[d.provider], d.model) for d in alias.deployments],
                routing=self.routing,
                strategy=alias.strategy,
            )
            for alias in aliases
        }
        self._resolved: dict[str, FallbackChain] = {}

    def resolve(self, model: str) -> FallbackChain:
        chain = self.aliases.get(model) or self._resolved.get(model)
        if chain is None:
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            chain = self._resolved[model] = self._unaliased(model)
        return chain

    def _unaliased(self, model: str) -> FallbackChain:
        name, sep, upstream_model = model.partition("/")
        provider = self._by_name.get(name) if sep and upstream_model else None
        if provider is not None:
            return FallbackChain([Deployment(provider, upstream_model)], routing=self.routing)
        return FallbackChain([Deployment(self.providers[0], model)], routing=self.routing)

    def replace_with(self, other: ProviderRegistry) -> tuple[Provider, ...]:
        """Route with ``other``'s providers and aliases from now on (a configuration reload).

        The providers replaced are returned: requests that resolved a route earlier still use
        them, so the caller closes them once those requests have finished.
        """
        previous = self.providers
        self._use(other.providers, other._alias_specs, other._cooldowns, other._caps)
        return previous

    def connection_pools(self) -> list[ConnectionPool]:
        """The pools of the providers routed to now (adapters have one; test doubles may not)."""
        return [p.connections for p in self.providers if isinstance(p, OpenAICompatibleProvider)]

    async def close(self) -> None:
        await close_providers(self.providers)


async def close_providers(providers: Iterable[Provider]) -> None:
    """Close each provider (its session), in order."""
    for provider in providers:
        await provider.close()


def _build_provider(spec: ProviderSpec, settings: Settings) -> Provider:
    """The provider of ``spec``, made by its kind's plugin (built in or installed)."""
    retries = settings.upstream_max_retries if spec.max_retries is None else spec.max_retries
    setup = ProviderSetup(
        name=spec.name,
        base_url=spec.base_url,
        api_key=spec.api_key,
        headers=spec.headers,
        options=spec.options,
        capabilities=spec.capabilities,
        timeouts=spec.timeouts(settings.request_timeout_seconds),
        retry=RetryPolicy(max_retries=retries),
        max_connections=spec.max_connections,
        max_response_bytes=settings.upstream_max_response_bytes,
    )
    try:
        provider: Provider = load_kind(spec.kind).factory(setup)  # a ProviderPlugin's factory
    except KindError as exc:
        raise ProviderBuildError(spec.name, str(exc)) from None
    except Exception as exc:  # a plugin's factory may fail in any way; say so in one line
        raise ProviderBuildError(
            spec.name, f'kind "{spec.kind}" could not build it: {type(exc).__name__}: {exc}'
        ) from None
    return provider


class ProviderBuildError(ConfigError):
    """A provider's kind could not make it from its (valid) entry; one line naming the provider."""

    def __init__(self, provider: str, problem: str) -> None:
        # Not ConfigError's "VARIABLE has invalid value" sentence: the entry was valid.
        Exception.__init__(self, f"LLMGW_CONFIG: provider {provider!r}: {problem}")
        self.variable = "LLMGW_CONFIG"


async def build_registry(
    settings: Settings, routing: RoutingPolicy | None = None
) -> ProviderRegistry:
    """Every configured provider, each with its own session. When one cannot be built, those
    built before it are closed before ProviderBuildError is raised: nothing is left open, at start
    or on a reload that keeps the running configuration.

    ``routing``: the policy to route with (its clocks); a new one otherwise."""
    specs = settings.routed_providers
    built: list[Provider] = []
    try:
        for spec in specs:
            built.append(_build_provider(spec, settings))
    except ProviderBuildError:
        await close_providers(built)
        raise
    return ProviderRegistry(
        built,
        settings.model_aliases,
        cooldowns={spec.name: spec.cooldown() for spec in specs},
        caps={spec.name: AccountCap(spec.rpm, spec.tpm) for spec in specs},
        routing=routing,
    )
