"""The contract of an API that llmgw serves by translating to and from OpenAI chat completions.

Chat completions are the pipeline's own language: every provider speaks them. An ingress for another
API (Anthropic Messages, OpenAI Responses) supplies an ``ApiCodec``; the pipeline runs the translated
request through the same keys, limits, routing, telemetry and accounting as a chat completion, then
hands the answer back to the codec. Translations are pure; the stream one is a small state machine.
"""

from __future__ import annotations

from typing import Any, Protocol

from llmgw.streaming.translate import StreamTranslator

__all__ = ["ApiCodec"]


class ApiCodec(Protocol):
    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The caller's request as a chat completions body; raises InvalidRequest on bad input."""
        ...

    async def from_chat(self, completion: dict[str, Any], *, request: dict[str, Any]) -> bytes:
        """A non-streamed chat completion as the caller API's JSON answer (once what the answer
        reports is settled: a stored response is written first)."""
        ...

    def stream_translator(
        self, *, request: dict[str, Any], estimated_input_tokens: int
    ) -> StreamTranslator:
        """A fresh state machine turning one stream's chat chunks into the caller API's events."""
        ...
