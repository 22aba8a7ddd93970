"""At start-up, ask each provider for its model list once, so a refused key is reported at once.

The check runs in the background and never blocks or fails start-up: a provider that is down now
may be up by the first request. A refused key is logged by the adapter (``upstream_auth_failed``).
"""

from __future__ import annotations

import asyncio
import logging

from llmgw.errors import GatewayError, UpstreamAuthFailed
from llmgw.providers.base import UpstreamHTTPError
from llmgw.providers.registry import ProviderRegistry

__all__ = ["check_credentials"]

log = logging.getLogger(__name__)


async def check_credentials(registry: ProviderRegistry, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    results = await asyncio.gather(
        *(provider.list_models(deadline) for provider in registry.providers),
        return_exceptions=True,
    )
    for provider, result in zip(registry.providers, results, strict=True):
        if isinstance(result, UpstreamAuthFailed):
            continue  # the adapter logged which provider refused its key
        if isinstance(result, GatewayError | UpstreamHTTPError):
            log.warning(
                "start-up check: provider %s could not list its models (%s); "
                "its key could not be checked",
                provider.name,
                result,
            )
        elif isinstance(result, BaseException):
            raise result
