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
from llmgw.streaming.translate import StreamTranslator
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
    __slots__ = (
        "decode_all",
        "document",
        "done",
        "failed",
        "garbled",
        "hide_usage_chunk",
        "observation",
        "seen_first",
    )

    def __init__(
        self, observation: ChatObservation, *, hide_usage_chunk: bool, decode_all: bool = False
    ) -> None:
        self.observation = observation
        self.hide_usage_chunk = hide_usage_chunk
        self.decode_all = decode_all  # a translator needs every chunk decoded
        self.document: dict[str, Any] | None = None  # the last event's chunk, when decoded
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
        self.document = None
        if event == DONE_EVENT:
            self.done = True
            return True
        interesting = (
            self.decode_all
            or not self.seen_first
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
        self.document = document
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
    translator: StreamTranslator | None = None,
) -> StreamSummary:
    """Send headers now, then every event as it completes; the upstream is always closed.

    Without a translator the caller gets the provider's events byte for byte; with one, what the
    translator makes of each decoded chunk (and its own opening, closing and error events).
    """
    response = web.StreamResponse(status=200, headers=STREAM_HEADERS)
    # A translator gets every chunk, the usage chunk too: it renders usage in its own API's shape.
    observer = _EventObserver(
        observation,
        hide_usage_chunk=hide_usage_chunk and translator is None,
        decode_all=translator is not None,
    )
    try:
        await response.prepare(request)
        if translator is not None:
            await response.write(translator.start())
        scanner = SSEScanner()
        async for data in upstream.chunks():
            events = scanner.feed(data)
            if not events:
                continue
            out = (
                _translate(events, observer, translator)
                if translator is not None
                else b"".join(event for event in events if observer.forward(event))
            )
            if out:
                await response.write(out)
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
        if translator is not None and not observer.failed:
            await response.write(translator.finish())
    except GatewayError as error:
        outcome, error_type = Outcome.FAILED, error.error_kind
        await _send_error(
            response, sse_error_event(error) if translator is None else translator.error(error)
        )
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away: closing the upstream (below) cancels the generation at once.
        raise
    finally:
        await upstream.close()
    return StreamSummary(response, outcome, error_type)


def _translate(
    events: list[bytes], observer: _EventObserver, translator: StreamTranslator
) -> bytes:
    """The translator's events for these provider events; an upstream error event ends the stream."""
    out = []
    for event in events:
        if not observer.forward(event):
            continue
        if observer.failed:
            raise UpstreamUnavailable(
                "The provider reported an error in the stream.", code="upstream_stream_error"
            )
        if observer.document is not None:
            out.append(translator.feed(observer.document))
    return b"".join(out)


async def _send_error(response: web.StreamResponse, event: bytes) -> None:
    try:
        await response.write(event)
        await response.write_eof()
    except ConnectionResetError:
        pass
