"""Which deployments serve a model name, and building providers from settings.

A name is resolved in this order: a configured alias (its deployments, in order); ``provider/model``
(that provider, asked for ``model``); anything else goes to the first provider, unchanged. The router
never needs to know a provider's kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aiohttp

from llmgw.config import DEFAULT_MAX_CONNECTIONS, Settings
from llmgw.provider_config import ModelAlias, ProviderKind, ProviderSpec
from llmgw.providers.anthropic import AnthropicProvider
from llmgw.providers.base import Deployment, Provider
from llmgw.providers.fallback import FallbackChain
from llmgw.providers.openai_compatible import EXACT_TIMEOUTS, OpenAICompatibleProvider
from llmgw.providers.pool import ConnectionPool
from llmgw.providers.retry import RetryPolicy
from llmgw.providers.venice import VeniceProvider
from llmgw.routing.caps import AccountCap
from llmgw.routing.policy import RoutingPolicy

__all__ = ["ADAPTERS", "ProviderRegistry", "build_registry", "new_client_session"]

ADAPTERS: Mapping[ProviderKind, type[OpenAICompatibleProvider]] = {
    "venice": VeniceProvider,
    "openai-compatible": OpenAICompatibleProvider,
    "anthropic": AnthropicProvider,
}


class ProviderRegistry:
    """``routing`` outlives reloads: a deployment that was down is still known to be down."""

    def __init__(
        self,
        providers: Sequence[Provider],
        aliases: Sequence[ModelAlias] = (),
        *,
        cooldowns: Mapping[str, float] | None = None,
        caps: Mapping[str, AccountCap] | None = None,
    ) -> None:
        if not providers:
            raise ValueError("at least one provider is required")
        self.routing = RoutingPolicy()
        self._use(providers, aliases, cooldowns or {}, caps or {})

    def _use(
        self,
        providers: Sequence[Provider],
        aliases: Sequence[ModelAlias],
        cooldowns: Mapping[str, float],
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

    def resolve(self, model: str) -> FallbackChain:
        chain = self.aliases.get(model)
        if chain is not None:
            return chain
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
        for provider in self.providers:
            await provider.close()


def new_client_session(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> aiohttp.ClientSession:
    """The one shared session of a provider: pooled keep-alive connections, no cookie jar.

    Its limit is the provider's ``ConnectionPool``'s, whose slots every call holds first, so
    the connector never queues a request itself (where the wait would be silent and unbounded).
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=max_connections,
            ttl_dns_cache=300,
            enable_cleanup_closed=True,
            timeout_ceil_threshold=EXACT_TIMEOUTS,
        ),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def _venice_from_environment(settings: Settings) -> ProviderSpec:
    """Without LLMGW_CONFIG: one provider ``venice`` from the VENICE_* variables."""
    return ProviderSpec(
        name="venice",
        kind="venice",
        base_url=settings.venice_base_url,
        api_key_env="VENICE_API_KEY",
        api_key=settings.venice_api_key,
        max_connections=settings.venice_max_connections,
    )


def _build_provider(spec: ProviderSpec, settings: Settings) -> Provider:
    return ADAPTERS[spec.kind](
        name=spec.name,
        base_url=spec.base_url,
        api_key=spec.api_key,
        session=new_client_session(spec.max_connections),
        retry=RetryPolicy(
            max_retries=settings.venice_max_retries
            if spec.max_retries is None
            else spec.max_retries
        ),
        timeouts=spec.timeouts(settings.request_timeout_seconds),
        headers=spec.headers,
        max_response_bytes=settings.upstream_max_response_bytes,
        speaks_responses=spec.responses == "native",
        capabilities=spec.capabilities,
        connections=ConnectionPool(spec.name, spec.max_connections),
    )


def build_registry(settings: Settings) -> ProviderRegistry:
    """Every configured provider, each with its own session. Call inside the event loop."""
    specs = settings.providers or (_venice_from_environment(settings),)
    return ProviderRegistry(
        [_build_provider(spec, settings) for spec in specs],
        settings.model_aliases,
        cooldowns={spec.name: spec.circuit_cooldown_seconds for spec in specs},
        caps={spec.name: AccountCap(spec.rpm, spec.tpm) for spec in specs},
    )
