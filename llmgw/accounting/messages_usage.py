"""Token usage as the Anthropic Messages API reports it, in llmgw's (OpenAI's) convention.

Anthropic's ``input_tokens`` excludes cache reads and writes (shared/anthropic-messages.md M2);
llmgw's ``Usage.input_tokens`` is every input token, with the cache counts as parts of it. A stream
reports usage twice: ``message_start`` (input and cache counts) and ``message_delta``, whose counts
are cumulative, so each field given replaces the one before rather than adding to it.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmgw.accounting.usage import Usage, reported_count

__all__ = ["MessagesUsage"]

_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


@attrs.define
class MessagesUsage:
    input_tokens: int | None = None  # Anthropic's: without cache reads and writes
    output_tokens: int | None = None  # thinking included
    cache_creation_input_tokens: int | None = None  # written to the cache (5 min and 1 h)
    cache_read_input_tokens: int | None = None
    # Of cache_creation_input_tokens, those written for an hour (priced apart from 5-minute ones).
    cache_creation_1h_input_tokens: int | None = None

    def merge(self, usage: Any) -> MessagesUsage:
        """Take the counts ``usage`` (a Messages ``usage`` object) reports; returns self."""
        if not isinstance(usage, dict):
            return self
        for name in _COUNTS:
            count = reported_count(usage.get(name))
            if count is not None:
                setattr(self, name, count)
        creation = usage.get("cache_creation")
        if isinstance(creation, dict):
            hour = reported_count(creation.get("ephemeral_1h_input_tokens"))
            if hour is not None:
                self.cache_creation_1h_input_tokens = hour
        return self

    @property
    def reported(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None

    @property
    def all_input_tokens(self) -> int | None:
        if self.input_tokens is None:
            return None
        return (
            self.input_tokens
            + (self.cache_creation_input_tokens or 0)
            + (self.cache_read_input_tokens or 0)
        )

    def usage(self) -> Usage | None:
        """The counts as llmgw's Usage (input: all of it); None when nothing was reported."""
        if not self.reported:
            return None
        return Usage(
            input_tokens=self.all_input_tokens,
            output_tokens=self.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens,
        )

    def chat_usage(self) -> dict[str, Any]:
        """Chat completions' usage object (what ``parse_usage`` reads back as ``usage()``)."""
        prompt = self.all_input_tokens or 0
        completion = self.output_tokens or 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {
                "cached_tokens": self.cache_read_input_tokens or 0,
                "cache_creation_input_tokens": self.cache_creation_input_tokens or 0,
            },
        }
