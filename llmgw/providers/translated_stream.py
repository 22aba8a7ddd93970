"""What every stream rewritten for the caller's API as it arrives shares (Gemini's, Bedrock's
event stream, Anthropic's read as chat): the upstream's retries and release, and how a stream
broken upstream is told."""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator

from llmgw.errors import UpstreamUnavailable
from llmgw.providers.base import ChatStream

__all__ = ["TranslatedStream"]


class TranslatedStream(abc.ABC):
    """An upstream stream relayed as server-sent events; a subclass writes ``chunks``."""

    content_type = "text/event-stream"

    def __init__(self, upstream: ChatStream, provider: str) -> None:
        self._upstream = upstream
        self._provider = provider
        self.retries = upstream.retries

    @abc.abstractmethod
    def chunks(self) -> AsyncGenerator[bytes, None]:
        """The caller's events, as the upstream's arrive."""

    def interrupted(self, what: str) -> UpstreamUnavailable:
        """The error of a stream the upstream broke off (``what`` it did): the route may
        continue it on another deployment."""
        return UpstreamUnavailable(f"{self._provider} {what}.", code="upstream_stream_interrupted")

    async def close(self) -> None:
        await self._upstream.close()
