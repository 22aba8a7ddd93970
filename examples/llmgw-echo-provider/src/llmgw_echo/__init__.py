"""An llmgw provider kind that answers from the request itself: the last user message, echoed.

It shows the whole plugin interface in one small module: an options spec (the kind's own keys),
a Provider (chat, streamed chat, usage, errors for what it does not serve) and the PLUGIN its
entry point names.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from llmgw.accounting.price import Price
from llmgw.accounting.usage import CostReport
from llmgw.config.converter import check
from llmgw.providers.base import UpstreamCall, UpstreamHTTPError, UpstreamResponse
from llmgw.providers.plugin import Capabilities, ProviderPlugin, ProviderSetup

__all__ = ["PLUGIN", "EchoOptions", "EchoProvider"]


@attrs.frozen
class EchoOptions:
    """The keys of a ``[[providers]]`` entry of kind echo besides the common ones."""

    prefix: str = attrs.field(
        default="echo: ", validator=check(lambda text: len(text) <= 100, "at most 100 characters")
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _words(text: str) -> int:
    return len(text.split())


class _EventStream:
    """A finished answer told as chat-completion chunks, then [DONE] (ChatStream)."""

    retries = 0
    content_type = "text/event-stream"

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = events

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        for event in self._events:
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def close(self) -> None:
        return None


class EchoProvider:
    # Usage carries tokens, no cost: llmgw prices it from its price table.
    cost_report: CostReport | None = None
    publishes_prices = False

    def __init__(self, setup: ProviderSetup[EchoOptions]) -> None:
        self.name = setup.name
        parts = urlsplit(setup.base_url)
        self.server_address = parts.hostname or ""
        self.server_port = parts.port or (443 if parts.scheme == "https" else 80)
        self.capabilities = setup.capabilities
        self._prefix = setup.options.prefix

    def _answer(self, call: UpstreamCall) -> tuple[dict[str, Any], str, dict[str, int]]:
        request = json.loads(call.body)
        messages = request.get("messages") or []
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        text = self._prefix + (_text(users[-1].get("content")) if users else "")
        prompt = sum(_words(_text(m.get("content"))) for m in messages if isinstance(m, dict))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": _words(text),
            "total_tokens": prompt + _words(text),
        }
        return request, text, usage

    async def chat_completion(self, call: UpstreamCall) -> UpstreamResponse:
        request, text, usage = self._answer(call)
        body = {
            "id": f"chatcmpl-echo-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
        return UpstreamResponse(200, json.dumps(body).encode(), "application/json")

    async def stream_chat_completion(self, call: UpstreamCall) -> _EventStream:
        request, text, usage = self._answer(call)
        base = {
            "id": f"chatcmpl-echo-{time.time_ns()}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": request.get("model"),
        }
        events = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
            *(
                {**base, "choices": [{"index": 0, "delta": {"content": piece}}]}
                for piece in re.findall(r"\S+\s*|\s+", text)  # word by word, spaces kept
            ),
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        options = request.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            events.append({**base, "choices": [], "usage": usage})
        return _EventStream(events)

    # What echo does not serve: an error in the OpenAI shape, with its status, which llmgw relays
    # to the caller in the shape of the API it speaks.
    def _unsupported(self, what: str) -> UpstreamHTTPError:
        error = {
            "error": {
                "message": f"{self.name} (kind echo) does not serve {what}.",
                "type": "invalid_request_error",
                "code": "unsupported",
            }
        }
        return UpstreamHTTPError(
            UpstreamResponse(404, json.dumps(error).encode(), "application/json")
        )

    async def embeddings(self, call: UpstreamCall) -> UpstreamResponse:
        raise self._unsupported("embeddings")

    async def forward(self, path: str, call: UpstreamCall) -> UpstreamResponse:
        raise self._unsupported(path)

    async def forward_stream(self, path: str, call: UpstreamCall, *, accept: str) -> _EventStream:
        raise self._unsupported(path)

    async def list_models(self, deadline: float) -> UpstreamResponse:
        listing = {
            "object": "list",
            "data": [{"id": "echo", "object": "model", "owned_by": self.name}],
        }
        return UpstreamResponse(200, json.dumps(listing).encode(), "application/json")

    async def published_prices(self, deadline: float) -> Mapping[str, Price]:
        return {}

    async def close(self) -> None:
        return None


PLUGIN: ProviderPlugin[EchoOptions] = ProviderPlugin(
    factory=EchoProvider,
    options=EchoOptions,
    # It takes reasoning_effort (and ignores it); it does not continue a trailing assistant message.
    capabilities=Capabilities(reasoning=True),
    summary="example plugin: answers with the last user message",
)
