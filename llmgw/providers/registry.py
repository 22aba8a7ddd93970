"""Which provider serves a model name, and building providers from settings.

A name of the form ``provider/model`` goes to that provider with ``model`` as its own id; any other
name goes to the first provider, unchanged. The router never needs to know a provider's kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
import attrs

from llmgw.config import Settings
from llmgw.providers.base import Provider
from llmgw.providers.retry import RetryPolicy
from llmgw.providers.venice import VeniceProvider

__all__ = ["ProviderRegistry", "Route", "build_registry", "new_client_session"]


@attrs.frozen(slots=True)
class Route:
    provider: Provider
    upstream_model: str
    rewrites_model: bool = False


class ProviderRegistry:
    def __init__(self, providers: Sequence[Provider]) -> None:
        if not providers:
            raise ValueError("at least one provider is required")
        self.providers = tuple(providers)
        self._by_name = {provider.name: provider for provider in providers}

    def resolve(self, model: str) -> Route:
        name, sep, upstream_model = model.partition("/")
        if sep and upstream_model:
            provider = self._by_name.get(name)
            if provider is not None:
                return Route(provider, upstream_model, rewrites_model=True)
        return Route(self.providers[0], model)

    async def close(self) -> None:
        for provider in self.providers:
            await provider.close()


def new_client_session() -> aiohttp.ClientSession:
    """The one shared session of a provider: pooled keep-alive connections, no cookie jar."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=512, ttl_dns_cache=300, enable_cleanup_closed=True),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def build_registry(settings: Settings) -> ProviderRegistry:
    """Providers from the environment: Venice, named ``venice``. Call inside the event loop."""
    venice = VeniceProvider(
        name="venice",
        base_url=settings.venice_base_url,
        api_key=settings.venice_api_key,
        session=new_client_session(),
        retry=RetryPolicy(max_retries=settings.venice_max_retries),
        idle_timeout=settings.request_timeout_seconds,
    )
    return ProviderRegistry([venice])
