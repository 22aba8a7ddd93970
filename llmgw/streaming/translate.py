"""The contract between the relay and an API whose stream is not OpenAI chat completions' own.

Chat completions streams are forwarded byte for byte. For another API (Anthropic Messages, OpenAI
Responses), the relay decodes each chat chunk and hands it to that API's ``StreamTranslator``, a small
state machine that returns the bytes (whole SSE events) to send to the caller instead.
"""

from __future__ import annotations

from typing import Any, Protocol

from llmgw.errors import GatewayError

__all__ = ["StreamTranslator"]


class StreamTranslator(Protocol):
    def start(self) -> bytes:
        """Events to send as soon as the stream is open (``message_start``, ``response.created``)."""
        ...

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Events for one decoded chat completion chunk (may be empty)."""
        ...

    async def finish(self) -> bytes:
        """Closing events once the provider's stream completed (usage is known by then, if
        reported), after what they report is settled (a stored response is written first)."""
        ...

    def error(self, error: GatewayError) -> bytes:
        """The caller API's error event for a stream that failed after it started."""
        ...
