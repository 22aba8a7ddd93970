"""What every translated API (Messages, Responses) requires of a provider's chat answer.

A provider's answer is not the caller's input: what no client could use (a tool call naming no
tool) is the provider's failure, answered as ``upstream_invalid_response`` (502, or an error event
in a stream), never passed on half-formed. Token counts that are no counts are handled where usage
is read (``llmgw.accounting.usage.reported_count``).
"""

from __future__ import annotations

from typing import Any

from llmgw.errors import UpstreamUnavailable

__all__ = ["first_choice", "tool_name"]


def tool_name(name: Any) -> str:
    """The name of the tool an answer calls; a call without one cannot be dispatched."""
    if not isinstance(name, str) or not name:
        raise UpstreamUnavailable(
            "The provider answered with a tool call that names no tool.",
            code="upstream_invalid_response",
        )
    return name


def first_choice(completion: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A non-streamed answer's first choice and its message, each an object (empty when the
    answer has none: the translation then says so in its own API's terms)."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, dict) else {}
    message = choice.get("message")
    return choice, message if isinstance(message, dict) else {}
