"""POST /v1/chat/completions: answered as JSON, or as SSE with ``"stream": true``."""

from __future__ import annotations

from aiohttp import web

from llmgw.api.body import validate_chat_request
from llmgw.api.pipeline import Operation, proxy
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.cache.key import CHAT as CHAT_API
from llmgw.telemetry import semconv as sc

__all__ = ["CHAT", "chat_completions"]

CHAT = Operation(
    name=sc.OPERATION_CHAT,
    validate=validate_chat_request,
    complete=lambda provider, call: provider.chat_completion(call),
    cache_api=CHAT_API,
)


async def chat_completions(request: web.Request, key: AuthenticatedKey) -> web.StreamResponse:
    return await proxy(request, key, CHAT)
