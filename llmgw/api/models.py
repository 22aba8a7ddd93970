"""GET /v1/models: every provider's models and the aliases, merged and cached briefly.

The first provider's ids are listed as they are (a plain name routes to it); the others' as
``provider/model``, the name that routes back to them. Aliases are listed as models owned by llmgw.
A provider whose listing fails is left out (for a shorter time in the cache) rather than failing the
whole list; only when every provider fails is the first one's error answered.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web

from llmgw import app_keys
from llmgw.api.pipeline import forward_upstream_error
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import GatewayError, UpstreamUnavailable
from llmgw.providers.base import Provider, UpstreamHTTPError
from llmgw.providers.registry import ProviderRegistry

__all__ = ["MODELS_CACHE", "ModelListCache", "list_models"]

log = logging.getLogger(__name__)

_JSON = "application/json"


class ModelListCache:
    def __init__(self, ttl: float = 60.0, partial_ttl: float = 5.0) -> None:
        self._ttl = ttl
        self._partial_ttl = partial_ttl  # a list missing a provider is refreshed sooner
        self._value: bytes | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()

    def clear(self) -> None:
        """Forget the list (the providers changed)."""
        self._value = None

    async def get(self, registry: ProviderRegistry, timeout: float) -> bytes:
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._value is None or loop.time() >= self._expires_at:
                self._value, complete = await _merged_listing(registry, loop.time() + timeout)
                self._expires_at = loop.time() + (self._ttl if complete else self._partial_ttl)
            return self._value


MODELS_CACHE = web.AppKey("models_cache", ModelListCache)


async def _listing(provider: Provider, deadline: float) -> dict[str, Any]:
    response = await provider.list_models(deadline)
    try:
        document = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        document = None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise UpstreamUnavailable(
            f"{provider.name} answered its model list with an unexpected body.",
            code="upstream_invalid_response",
        )
    return document


async def _merged_listing(registry: ProviderRegistry, deadline: float) -> tuple[bytes, bool]:
    """The merged list, and whether every provider is in it. Raises if none could be listed."""
    results = await asyncio.gather(
        *(_listing(provider, deadline) for provider in registry.providers), return_exceptions=True
    )
    merged: dict[str, Any] | None = None
    for index, (provider, result) in enumerate(zip(registry.providers, results, strict=True)):
        if isinstance(result, BaseException):
            if not isinstance(result, GatewayError | UpstreamHTTPError):
                raise result
            log.warning("listing the models of %s failed: %s", provider.name, result)
            continue
        if merged is None:
            merged = {**result, "data": []}  # the first answer's other fields ("object", ...)
        for item in result["data"]:
            if index > 0 and isinstance(item, dict) and isinstance(item.get("id"), str):
                item = {**item, "id": f"{provider.name}/{item['id']}"}
            merged["data"].append(item)
    if merged is None:
        raise next(r for r in results if isinstance(r, BaseException))
    merged["data"].extend(
        {"id": alias, "object": "model", "owned_by": "llmgw"} for alias in registry.aliases
    )
    complete = not any(isinstance(r, BaseException) for r in results)
    return orjson.dumps(merged), complete


async def list_models(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    settings = request.app[app_keys.SETTINGS]
    try:
        body = await request.app[MODELS_CACHE].get(
            request.app[app_keys.PROVIDERS], settings.request_timeout_seconds
        )
    except UpstreamHTTPError as exc:
        return forward_upstream_error(exc.response)
    if key.allowed_models:
        body = _only_allowed(body, key)
    return web.Response(body=body, headers={"Content-Type": _JSON})


def _only_allowed(listing: bytes, key: AuthenticatedKey) -> bytes:
    """The listing narrowed to the models the key's allowlist names."""
    document = orjson.loads(listing)
    document["data"] = [
        item
        for item in document["data"]
        if isinstance(item, dict) and key.allows_model(item.get("id", ""))
    ]
    return orjson.dumps(document)
