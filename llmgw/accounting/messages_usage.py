"""A Messages stream's token usage as it arrives (see ``usage.anthropic_usage`` for the convention).

A stream reports usage twice: ``message_start`` (input and cache counts) and ``message_delta``,
whose counts are cumulative (shared/anthropic-messages.md M3), so each field given replaces the one
before rather than adding to it, and one left out keeps its earlier value. Cumulative counts never
go down: a count lower than the one before (a second ``message_start``) is not taken; a value that
is no count is (the charge flags it and bills the estimate).
"""

from __future__ import annotations

from typing import Any

import attrs

from llmgw.accounting.usage import Usage, anthropic_usage

__all__ = ["MessagesUsage"]


@attrs.define
class MessagesUsage:
    _fields: dict[str, Any] = attrs.field(factory=dict)  # Anthropic's usage fields, the latest

    def merge(self, usage: Any) -> MessagesUsage:
        """Take the fields ``usage`` (a Messages ``usage`` object) reports; returns self."""
        if isinstance(usage, dict):
            _merge(self._fields, usage)
        return self

    def usage(self) -> Usage | None:
        """The counts so far in llmgw's convention; None when neither input nor output came."""
        usage = anthropic_usage(self._fields)
        return None if usage.input_tokens is None and usage.output_tokens is None else usage

    def chat_usage(self) -> dict[str, Any]:
        """Chat completions' usage object (what ``parse_usage`` reads back as ``usage()``)."""
        usage = self.usage() or Usage()
        prompt = usage.input_tokens or 0
        completion = usage.output_tokens or 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {
                "cached_tokens": usage.cache_read_input_tokens or 0,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens or 0,
                "cache_creation_1h_input_tokens": usage.cache_creation_1h_input_tokens or 0,
            },
        }


def _merge(fields: dict[str, Any], usage: dict[str, Any]) -> None:
    for name, value in usage.items():
        if value is None:
            continue
        earlier = fields.get(name)
        if isinstance(value, dict):
            merged = dict(earlier) if isinstance(earlier, dict) else {}
            _merge(merged, value)
            fields[name] = merged
        elif not (_is_count(earlier) and _is_count(value) and value < earlier):
            fields[name] = value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
