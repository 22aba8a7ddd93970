"""Finishing an answer whose stream broke after part of it reached the caller.

The caller has the start of an answer (``Transcript``: its text, and whether it is in a state that
can be continued at all). The pipeline opens a new stream for the rest (``Resume``): on a
deployment that continues a trailing assistant message, the request plus that message holding
exactly the text sent; on any other, the request as it was. ``Splice`` turns the new stream's
chunks into the continuation of the one the caller has: without a second ``role``, without a
second reasoning block, and after a restart without the text the caller already has, which the
restarted answer must begin with, or the answer cannot be finished (``ContinuationMismatch``).

A prefill continues the caller's answer, so it is sent only what is left of the caller's output
budget (``max_tokens`` / ``max_completion_tokens``, a Messages or Responses caller's limit too, as
the chat body carries it); a restart spends the whole budget again on the same text. When nothing
is left, the answer ends at ``length`` instead (issue 34, item 5).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from llmgw.errors import UpstreamUnavailable
from llmgw.providers.base import ChatStream

__all__ = [
    "MODE_PREFILL",
    "MODE_RESTART",
    "Continuation",
    "ContinuationMismatch",
    "Resume",
    "Resumed",
    "Splice",
    "Transcript",
    "output_budget",
    "with_output_budget",
]

MODE_PREFILL = "prefill"
MODE_RESTART = "restart"

# Delta fields a continuation must not repeat: the caller has the role and (when the break came
# after it) the reasoning already; a restarted answer reasons again, which is not part of the text.
_DROPPED_FIELDS = frozenset({"role", "reasoning_content", "reasoning"})
# What a stream's opening chunk without choices holds (Azure's; shared/azure-openai.md Z5 names
# both spellings).
_HEADER_FIELDS = frozenset({"prompt_filter_results", "prompt_annotations"})


class ContinuationMismatch(UpstreamUnavailable):
    """The restarted answer is not the one the caller has the start of."""

    code = "upstream_stream_interrupted"

    def __init__(self) -> None:
        super().__init__(
            "The provider broke off the stream, and the answer could not be finished: asked "
            "again, it began differently from the text already sent."
        )


@attrs.frozen(slots=True)
class Resumed:
    """A new stream for the rest of the answer, and how it was asked for."""

    stream: ChatStream
    deployment: str  # the label of the deployment that continues
    prefilled: bool  # sent the text so far as an assistant message (else: restarted)


# The text the caller has been sent, and the output tokens left of the caller's budget (None: no
# budget) -> a new stream for the rest (or a GatewayError, UpstreamHTTPError when no deployment
# would take it).
Resume = Callable[[str, int | None], Awaitable[Resumed]]

# The chat fields that bound an answer's output tokens (a Messages caller's ``max_tokens`` and a
# Responses caller's ``max_output_tokens`` arrive as ``max_completion_tokens``).
_BUDGET_FIELDS = ("max_tokens", "max_completion_tokens")


@attrs.define(slots=True)
class Continuation:
    """How a relay may finish a broken stream: ``resume``, at most ``left`` more times, within
    ``budget`` output tokens in all (None: the caller set none)."""

    resume: Resume
    deployment: str  # the deployment whose stream is relayed now
    left: int
    budget: int | None = None


def output_budget(body: dict[str, Any]) -> int | None:
    """The most output tokens a chat body lets the answer have, or None when it sets no bound."""
    limits = [
        value
        for value in (body.get(field) for field in _BUDGET_FIELDS)
        if value.__class__ is int and value >= 0
    ]
    return min(limits) if limits else None


def with_output_budget(body: dict[str, Any], left: int) -> dict[str, Any]:
    """``body`` asking for at most ``left`` output tokens, in the fields it bounds them with."""
    return {**body, **{field: left for field in _BUDGET_FIELDS if field in body}}


class Transcript:
    """What the caller has been sent of the answer's one choice."""

    __slots__ = ("_parts", "blocked", "in_reasoning")

    def __init__(self) -> None:
        self._parts: list[str] = []
        # Why the answer cannot be continued, once it cannot: inside a tool call (its arguments
        # cannot be prefilled as text), several choices.
        self.blocked: str | None = None
        self.in_reasoning = False  # reasoning was sent and no answer text after it yet

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def why_not(self) -> str | None:
        """Why a break now could not be continued, or None."""
        if self.blocked is not None:
            return self.blocked
        return "inside a reasoning block" if self.in_reasoning else None

    def note(self, document: dict[str, Any]) -> None:
        """One chunk the caller was sent."""
        choices = document.get("choices")
        if choices.__class__ is not list:
            return
        for choice in choices:  # the hot path: every chunk of every stream
            if choice.__class__ is not dict:
                continue
            if choice.get("index", 0) != 0:
                self.blocked = "with several choices"
            delta = choice.get("delta")
            if delta.__class__ is not dict:
                continue
            if delta.get("tool_calls"):
                self.blocked = "inside a tool call"
            content = delta.get("content")
            if content.__class__ is str and content:
                self._parts.append(content)
                self.in_reasoning = False
            elif delta.get("reasoning_content") or delta.get("reasoning"):
                self.in_reasoning = True


class Splice:
    """A continuation stream's chunks, as the rest of the answer the caller has."""

    __slots__ = ("_pending",)

    def __init__(self, sent: str, *, prefilled: bool) -> None:
        # Text the restarted answer must repeat before anything of it is new to the caller.
        self._pending = "" if prefilled else sent

    def chunk(self, document: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk as the caller gets it, or None when nothing of it is new."""
        choices = document.get("choices")
        if choices.__class__ is not list or not choices:
            # Usage, or anything else without choices, is passed on; but not a second header:
            # Azure opens every stream with the prompt's filter results in a chunk of their own,
            # which the caller already has from the stream this one continues.
            return None if _HEADER_FIELDS & document.keys() else document
        kept = [choice for choice in map(self._choice, choices) if choice is not None]
        return {**document, "choices": kept} if kept else None

    def _choice(self, choice: Any) -> dict[str, Any] | None:
        if choice.__class__ is not dict:
            return None
        delta = choice.get("delta")
        if delta.__class__ is dict:
            delta = {key: value for key, value in delta.items() if key not in _DROPPED_FIELDS}
            if self._pending:
                self._skip_repeated(delta)
        finish = choice.get("finish_reason")
        if self._pending and finish is not None:
            raise ContinuationMismatch()  # it ended before it got as far as the caller is
        if finish is None and not _carries(delta):
            return None
        return {**choice, "delta": delta}

    def _skip_repeated(self, delta: dict[str, Any]) -> None:
        """Take from ``delta`` the text the caller already has; raise when it differs."""
        if delta.get("tool_calls"):
            raise ContinuationMismatch()
        content = delta.get("content")
        if content.__class__ is not str or not content:
            return
        pending = self._pending
        shared = min(len(pending), len(content))
        if content[:shared] != pending[:shared]:
            raise ContinuationMismatch()
        self._pending = pending[shared:]
        delta["content"] = content[shared:]


def _carries(delta: Any) -> bool:
    if delta.__class__ is not dict:
        return False
    return any(value not in (None, "", [], {}, False) for value in delta.values())
