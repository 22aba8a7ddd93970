"""What one relayed stream came to: the pipeline finishes its observation and record from this."""

from __future__ import annotations

from typing import Protocol

import attrs

from llmgw.accounting.usage import Usage

__all__ = ["CLIENT_CLOSED_REQUEST", "StreamAttempt", "StreamSummary", "StreamTap"]

# Status recorded for a request whose client went away before the answer (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


@attrs.frozen(slots=True)
class StreamAttempt:
    """An upstream stream that broke and whose answer another one finished: it is billed too."""

    deployment: str  # "provider:model"
    usage: Usage | None  # as the provider reported it (rarely, before breaking)
    output_chars: int  # what it produced, for an estimate when it reported nothing
    error: str | None = None  # how it broke off (an error type)
    response_model: str | None = None  # the model its chunks named


@attrs.frozen(slots=True)
class StreamSummary:
    outcome: str  # telemetry.genai.Outcome: completed, failed or cancelled
    status: int  # 200 (the status the caller was sent), or 499 when the caller left mid-stream
    error_type: str | None
    usage: Usage | None  # as the provider reported it; None when it never came
    # Characters of content, reasoning and tool-call arguments the provider sent (for an estimate).
    output_chars: int
    # The attempts before the last, oldest first, when a broken stream was continued.
    earlier: tuple[StreamAttempt, ...] = ()
    # False when ``usage`` is not the final count: a Messages stream that ended (the caller
    # left, the gateway cut it) after message_start and before message_delta.
    usage_final: bool = True
    # The answer's own id and model, as its events said them (None: they did not).
    response_id: str | None = None
    response_model: str | None = None  # the last attempt's (a continuation's, not the start's)
    # When the first chunk arrived (perf_counter); not part of what a summary is equal to.
    first_chunk_at: float | None = attrs.field(default=None, eq=False)


class StreamTap(Protocol):
    """Sees a relayed answer's upstream events as they pass (the response cache records them)."""

    def event(self, event: bytes) -> None:
        """One decoded event of the upstream (the usage chunk included, shown or not)."""

    def broken(self) -> None:
        """The answer is being continued on another stream: no longer one stream's events."""

    def completed(self) -> None:
        """The answer ended normally and the caller was sent all of it."""
