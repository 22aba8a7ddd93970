"""Forward a provider's event stream to the client event by event, observing it cheaply.

Each event is written as soon as it is complete. Only events that can carry what telemetry needs
(the first one, ``finish_reason``, ``usage``, errors) are decoded; the rest are forwarded untouched.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import orjson
from aiohttp import web

from llmgw.accounting.usage import parse_usage
from llmgw.errors import GatewayError, UpstreamUnavailable
from llmgw.providers.base import ChatStream
from llmgw.streaming.sse import DONE_EVENT, SSEScanner, event_data
from llmgw.telemetry.genai import ChatObservation, Outcome

__all__ = ["STREAM_HEADERS", "StreamSummary", "relay_stream", "sse_error_event"]

STREAM_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Tells nginx and similar proxies in front of us not to buffer the stream.
    "X-Accel-Buffering": "no",
}
_USAGE = b'"usage":{'
_FINISH = b'"finish_reason":"'
_ERROR = b'{"error"'
_EMPTY_CHOICES = b'"choices":[]'


@attrs.frozen(slots=True)
class StreamSummary:
    """How a relayed stream ended (a client that left raises instead: the request is cancelled)."""

    response: web.StreamResponse
    outcome: str
    error_type: str | None


def sse_error_event(error: GatewayError) -> bytes:
    return b"data: " + error.body_bytes() + b"\n\n"


class _EventObserver:
    __slots__ = ("done", "failed", "garbled", "hide_usage_chunk", "observation", "seen_first")

    def __init__(self, observation: ChatObservation, *, hide_usage_chunk: bool) -> None:
        self.observation = observation
        self.hide_usage_chunk = hide_usage_chunk
        self.seen_first = False
        self.done = False
        self.failed = False
        self.garbled = False  # an event we decoded carried data that is not a JSON object

    def forward(self, event: bytes) -> bool:
        """Observe one event; False when the caller must not see it."""
        if self.garbled:
            return False
        observation = self.observation
        observation.chunk_arrived()
        if event == DONE_EVENT:
            self.done = True
            return True
        interesting = (
            not self.seen_first
            or observation.capture_content
            or _USAGE in event
            or _FINISH in event
            or _ERROR in event
        )
        if not interesting:
            return True
        self.seen_first = True
        document = self._decode(event)
        if document is None:
            # A comment or an empty event is fine; a data payload that is not JSON is garbage.
            self.garbled = bool(event_data(event).strip())
            return not self.garbled
        if "error" in document and "choices" not in document:
            self.failed = True
            return True
        observation.note_document(document)
        usage = parse_usage(document, with_cost=observation.provider_reports_cost)
        if usage is not None:
            observation.usage = usage
            if self.hide_usage_chunk and _EMPTY_CHOICES in event:
                return False
        return True

    @staticmethod
    def _decode(event: bytes) -> dict[str, Any] | None:
        try:
            document = orjson.loads(event_data(event))
        except orjson.JSONDecodeError:
            return None
        return document if isinstance(document, dict) else None


async def relay_stream(
    request: web.Request,
    upstream: ChatStream,
    observation: ChatObservation,
    *,
    hide_usage_chunk: bool,
) -> StreamSummary:
    """Send headers now, then every event as it completes; the upstream is always closed."""
    response = web.StreamResponse(status=200, headers=STREAM_HEADERS)
    observer = _EventObserver(observation, hide_usage_chunk=hide_usage_chunk)
    try:
        await response.prepare(request)
        scanner = SSEScanner()
        async for data in upstream.chunks():
            events = scanner.feed(data)
            if not events:
                continue
            forwarded = [event for event in events if observer.forward(event)]
            if forwarded:
                await response.write(b"".join(forwarded))
            if observer.garbled:
                raise UpstreamUnavailable(
                    "The provider sent stream data that is not JSON; the stream was ended.",
                    code="upstream_invalid_response",
                )
        if not observer.done:
            raise UpstreamUnavailable(
                "The provider ended the stream before it was complete.",
                code="upstream_stream_incomplete",
            )
        outcome, error_type = (
            (Outcome.FAILED, "upstream_stream_error")
            if observer.failed
            else (Outcome.COMPLETED, None)
        )
    except GatewayError as error:
        outcome, error_type = Outcome.FAILED, error.error_kind
        await _send_error(response, error)
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away: closing the upstream (below) cancels the generation at once.
        raise
    finally:
        await upstream.close()
    return StreamSummary(response, outcome, error_type)


async def _send_error(response: web.StreamResponse, error: GatewayError) -> None:
    try:
        await response.write(sse_error_event(error))
        await response.write_eof()
    except ConnectionResetError:
        pass
