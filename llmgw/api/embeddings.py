"""POST /v1/embeddings: routed, limited, observed and billed like chat; the answer is the provider's."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmgw.api.body import validate_embeddings_request
from llmgw.api.pipeline import Operation, proxy
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.cache.key import EMBEDDINGS as EMBEDDINGS_API
from llmgw.telemetry import semconv as sc

__all__ = ["EMBEDDINGS", "create_embeddings"]


def _validate(body: dict[str, Any]) -> tuple[str, bool]:
    return validate_embeddings_request(body), False  # never streamed


EMBEDDINGS = Operation(
    name=sc.OPERATION_EMBEDDINGS,
    validate=_validate,
    complete=lambda provider, call: provider.embeddings(call),
    sends_chat=False,
    cache_api=EMBEDDINGS_API,
)


async def create_embeddings(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    return await proxy(request, key, EMBEDDINGS)
