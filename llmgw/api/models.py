"""GET /v1/models: every provider's models and the aliases, merged and cached briefly.

The first provider's ids are listed as they are (a plain name routes to it); the others' as
``provider/model``, the name that routes back to them. Aliases are listed as models owned by llmgw.
A provider whose listing fails is left out (for a shorter time in the cache) rather than failing the
whole list; only when every provider fails is the first one's error answered, and that failure is
remembered for a few seconds. One refresh runs at a time and every caller waits for that same one
(bounded by the request timeout), never for a queue of them; while it runs, an expired list is
served as it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from llmgw import app_keys
from llmgw.api.pipeline import forward_upstream_error
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import GatewayError, UpstreamUnavailable
from llmgw.providers.base import Provider, UpstreamHTTPError
from llmgw.routing.registry import ProviderRegistry
from llmgw.telemetry.model_names import remember_listed

__all__ = ["MODELS_CACHE", "ModelListCache", "list_models"]

log = logging.getLogger(__name__)

_JSON = "application/json"


class ModelListCache:
    def __init__(
        self,
        ttl: float = 60.0,
        partial_ttl: float = 5.0,
        failure_ttl: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock  # the lifetimes; a listing's deadline is the event loop's
        self._ttl = ttl
        self._partial_ttl = partial_ttl  # a list missing a provider is refreshed sooner
        self._failure_ttl = failure_ttl  # every provider failed: answer that, briefly, at once
        self._value: bytes | None = None
        self._expires_at = 0.0
        self._failure: Exception | None = None
        self._failure_until = 0.0
        self._refresh: asyncio.Task[bytes] | None = None

    def clear(self) -> None:
        """Forget the list (the providers changed)."""
        self._value = None

    async def get(self, registry: ProviderRegistry, timeout: float) -> bytes:
        now = self._clock()
        if self._value is not None and now < self._expires_at:
            return self._value
        failed_recently = self._failure is not None and now < self._failure_until
        if self._refresh is None and not failed_recently:
            self._refresh = asyncio.create_task(self._load(registry, timeout))
            self._refresh.add_done_callback(_retrieve_outcome)
        if self._value is not None:
            return self._value  # stale, while a refresh runs or after one failed
        if self._refresh is None:
            assert self._failure is not None
            raise self._failure
        # Shielded: a caller who leaves must not cancel the refresh the others wait for.
        return await asyncio.shield(self._refresh)

    async def _load(self, registry: ProviderRegistry, timeout: float) -> bytes:
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            value, complete = await _merged_listing(registry, deadline)
        except (GatewayError, UpstreamHTTPError) as exc:
            self._failure, self._failure_until = exc, self._clock() + self._failure_ttl
            raise
        finally:
            self._refresh = None
        self._value, self._failure = value, None
        remember_listed(_ids(value))
        self._expires_at = self._clock() + (self._ttl if complete else self._partial_ttl)
        return value


def _ids(listing: bytes) -> list[str]:
    data = orjson.loads(listing)["data"]
    return [
        item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)
    ]


def _retrieve_outcome(task: asyncio.Task[bytes]) -> None:
    """A refresh nobody awaited (a stale list was served) must not log 'never retrieved'."""
    if not task.cancelled():
        task.exception()


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
    if key.restricts_models:
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
