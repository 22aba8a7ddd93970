"""The chat completion chunks a translated stream is relayed as: each repeats its stream's id,
creation time and model, and carries one delta, a finish reason, or the usage."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["ChatChunkHead"]


@attrs.define(slots=True)
class ChatChunkHead:
    """What every chunk of one stream repeats; ``id`` and ``model`` as the upstream names them
    once its stream has begun."""

    id: Any
    created: int
    model: Any

    def chunk(self, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {**self._head(), "choices": [choice]}

    def usage_chunk(self, usage: Any) -> dict[str, Any]:
        """The last chunk before ``[DONE]`` of a caller that asked for ``include_usage``."""
        return {**self._head(), "choices": [], "usage": usage}

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
