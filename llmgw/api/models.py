"""GET /v1/models: the provider's model list, cached briefly so listing is not an upstream call each time."""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmgw import app_keys
from llmgw.api.chat import forward_upstream_error
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.providers.base import UpstreamHTTPError, UpstreamResponse

__all__ = ["ModelListCache", "list_models"]


class ModelListCache:
    def __init__(self, ttl: float = 60.0) -> None:
        self._ttl = ttl
        self._value: UpstreamResponse | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()

    async def get(self, request: web.Request) -> UpstreamResponse:
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._value is None or loop.time() >= self._expires_at:
                settings = request.app[app_keys.SETTINGS]
                provider = request.app[app_keys.PROVIDERS].providers[0]
                self._value = await provider.list_models(
                    loop.time() + settings.request_timeout_seconds
                )
                self._expires_at = loop.time() + self._ttl
            return self._value


MODELS_CACHE = web.AppKey("models_cache", ModelListCache)


async def list_models(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    try:
        models = await request.app[MODELS_CACHE].get(request)
    except UpstreamHTTPError as exc:
        return forward_upstream_error(exc.response)
    return web.Response(body=models.body, headers={"Content-Type": models.content_type})
