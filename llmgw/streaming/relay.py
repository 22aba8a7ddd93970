"""Forward a provider's event stream to the client event by event, and say how it ended.

Each event is written as soon as it is complete, as the bytes the provider sent (or, for another
API, as its ``StreamTranslator`` renders it). The relay delivers exactly one :class:`StreamSummary`
to ``on_end``:

- ``[DONE]`` forwarded: the upstream is closed at once and the stream is ``completed``, whatever the
  caller does next (the sync openai SDK hangs up right after ``[DONE]``).
- The upstream closed cleanly after a finish chunk without ``[DONE]``: the gateway sends it;
  ``completed``.
- The caller left after the finish chunk but before the usage: the answer was delivered, so it is
  ``completed``; the upstream is read on in the background for a few seconds to get the usage.
- The caller left earlier: ``cancelled`` with status 499, and the upstream closed (which stops the
  generation).
- Anything else (an error event, a broken or garbled stream, a bound reached, shutdown, a failure
  of the gateway's own): an error event to the caller and ``failed``. Once the headers are sent,
  nothing but events is ever written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson
from aiohttp import web

from llmgw.errors import GatewayError, InternalError, UpstreamUnavailable
from llmgw.providers.base import ChatStream
from llmgw.streaming.completion import completion_events
from llmgw.streaming.observer import StreamObserver
from llmgw.streaming.sse import EventTooLarge, SSEScanner
from llmgw.streaming.summary import CLIENT_CLOSED_REQUEST, StreamSummary
from llmgw.streaming.supervisor import STREAMS, StreamSupervisor, gateway_shutting_down
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry.genai import ChatObservation, Outcome

__all__ = ["STREAM_HEADERS", "USAGE_DRAIN_SECONDS", "relay_stream", "sse_error_event"]

log = logging.getLogger("llmgw.streaming")

STREAM_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    # Tells nginx and similar proxies in front of us not to buffer the stream.
    "X-Accel-Buffering": "no",
}
# How long the upstream is read after the caller left past the finish chunk, for its usage.
USAGE_DRAIN_SECONDS = 5.0
_DONE_EVENT = b"data: [DONE]\n\n"


def sse_error_event(error: GatewayError) -> bytes:
    return b"data: " + error.body_bytes() + b"\n\n"


async def relay_stream(
    request: web.Request,
    upstream: ChatStream,
    observation: ChatObservation,
    *,
    hide_usage_chunk: bool,
    on_end: Callable[[StreamSummary], None],
    translator: StreamTranslator | None = None,
) -> web.StreamResponse:
    """Send headers now, then every event as it completes; ``on_end`` is told once how it ended.

    Without a translator the caller gets the provider's events byte for byte; with one, what the
    translator makes of each decoded chunk (and its own opening, closing and error events).
    """
    relay = _Relay(
        request.app[STREAMS], upstream, observation, hide_usage_chunk, translator, on_end
    )
    return await relay.run(request)


class _Relay:
    def __init__(
        self,
        streams: StreamSupervisor,
        upstream: ChatStream,
        observation: ChatObservation,
        hide_usage_chunk: bool,
        translator: StreamTranslator | None,
        on_end: Callable[[StreamSummary], None],
    ) -> None:
        self.streams = streams
        self.upstream = upstream
        self.translator = translator
        # A translator gets every chunk, the usage chunk too: it renders usage in its own shape.
        self.observer = StreamObserver(
            observation, hide_usage_chunk=hide_usage_chunk and translator is None
        )
        self.scanner = SSEScanner(streams.max_event_bytes)
        self._on_end: Callable[[StreamSummary], None] | None = on_end

    async def run(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=STREAM_HEADERS)
        observer = self.observer
        drain = False
        try:
            await response.prepare(request)
            if self.translator is not None:
                await response.write(self.translator.start())
            async with self.streams.bounded():
                await self._forward(response)
            if not observer.done:
                if not observer.finished or observer.upstream_error:
                    raise UpstreamUnavailable(
                        "The provider ended the stream before it was complete.",
                        code="upstream_stream_incomplete",
                    )
                if self.translator is None:  # a clean close after the finish chunk: complete
                    await response.write(_DONE_EVENT)
            if observer.upstream_error:
                self._end(Outcome.FAILED, "upstream_stream_error")
            else:
                if self.translator is not None:
                    await response.write(await self.translator.finish())
                self._end(Outcome.COMPLETED)
        except GatewayError as error:
            self._end(Outcome.FAILED, error.error_kind)
            await self._send_error(response, error)
        except (ConnectionResetError, asyncio.CancelledError):
            drain = self._caller_left()
            raise
        except Exception:
            if not response.prepared:
                raise  # no headers sent: the error middleware answers
            # The gateway's own failure after the headers went out: the caller gets the API's
            # error event, never a second response written inside this one.
            log.exception("a relayed stream failed inside the gateway")
            self._end(Outcome.FAILED, "internal_error")
            await self._send_error(
                response, InternalError("The gateway failed unexpectedly; see its logs.")
            )
        finally:
            if drain:
                self.streams.drain(self._drain_usage())
            else:
                await self.upstream.close()
                self._end(Outcome.FAILED, "internal_error")  # only if nothing above ended it
        return response

    async def _forward(self, response: web.StreamResponse) -> None:
        """Forward events until ``[DONE]`` or the end of the upstream."""
        observer = self.observer
        async with contextlib.aclosing(self._upstream_bytes()) as source:
            async for data in source:
                out: list[bytes] = []
                try:
                    for event in self._events(data):
                        if not observer.observe(event):
                            continue
                        if self.translator is None:
                            out.append(_complete_crlf(event) if observer.done else event)
                        elif observer.upstream_error:
                            break  # after what came before it reached the caller (below)
                        elif observer.document is not None:
                            out.append(self.translator.feed(observer.document))
                        if observer.done:
                            break
                finally:
                    # Even when a chunk is refused (a translator raised): what came before it
                    # reaches the caller ahead of the error event.
                    if out:
                        await response.write(b"".join(out))
                if self.translator is not None and observer.upstream_error:
                    raise UpstreamUnavailable(
                        "The provider reported an error in the stream.",
                        code="upstream_stream_error",
                    )
                if observer.garbled:
                    raise UpstreamUnavailable(
                        "The provider sent stream data that is not JSON; the stream was ended.",
                        code="upstream_invalid_response",
                    )
                if observer.done:
                    return

    def _upstream_bytes(self) -> AsyncGenerator[bytes, None]:
        """The upstream's stream; a JSON completion (some providers' answer) turned into one."""
        media_type = self.upstream.content_type.partition(";")[0].strip().lower()
        if media_type != "application/json":
            return self.upstream.chunks()  # not wrapped: a generator less to resume per read
        return self._completion_events()

    async def _completion_events(self) -> AsyncGenerator[bytes, None]:
        body = bytearray()
        async for data in self.upstream.chunks():
            body += data
            if len(body) > self.streams.max_event_bytes:
                raise _event_too_large(self.streams.max_event_bytes)
        try:
            completion: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            raise UpstreamUnavailable(
                "The provider answered the stream with JSON that is not a completion.",
                code="upstream_invalid_response",
            )
        yield completion_events(completion)

    def _events(self, data: bytes) -> list[bytes]:
        try:
            return self.scanner.feed(data)
        except EventTooLarge:
            raise _event_too_large(self.streams.max_event_bytes) from None

    def _caller_left(self) -> bool:
        """The caller hung up (or shutdown cut the handler): record it; True to drain for usage."""
        observer = self.observer
        if self.streams.shutdown_cut():
            self._end(Outcome.FAILED, gateway_shutting_down().error_kind)
        elif observer.done or (observer.finished and observer.usage is not None):
            self._end(Outcome.COMPLETED)
        elif not observer.finished or observer.upstream_error:
            self._end(Outcome.CANCELLED, "cancelled", status=CLIENT_CLOSED_REQUEST)
        else:
            return True  # the answer was delivered, its usage not yet
        return False

    async def _drain_usage(self) -> None:
        """Read the rest of an answer its caller no longer reads, for the provider's usage."""
        observer = self.observer
        try:
            async with asyncio.timeout(USAGE_DRAIN_SECONDS):
                async for data in self.upstream.chunks():
                    for event in self._events(data):
                        observer.observe(event)
                    if observer.done or observer.usage is not None or observer.garbled:
                        break
        except (GatewayError, TimeoutError) as error:
            log.info("the usage of a stream whose caller left did not come (%s)", error)
        finally:
            await self.upstream.close()
            self._end(Outcome.COMPLETED)

    def _end(self, outcome: str, error_type: str | None = None, *, status: int = 200) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is None:
            return
        observer = self.observer
        on_end(
            StreamSummary(
                outcome=outcome,
                status=status,
                error_type=error_type,
                usage=observer.usage,
                output_chars=observer.output_chars,
            )
        )

    def _error_event(self, error: GatewayError) -> bytes:
        return sse_error_event(error) if self.translator is None else self.translator.error(error)

    async def _send_error(self, response: web.StreamResponse, error: GatewayError) -> None:
        try:
            event = self._error_event(error)
        except Exception:
            # A translator that cannot even render its error: the stream just ends, incomplete.
            log.exception("the error event of a relayed stream could not be rendered")
            event = b""
        with contextlib.suppress(ConnectionResetError):
            await response.write(event)
            await response.write_eof()


def _complete_crlf(event: bytes) -> bytes:
    """The last event, with the LF of its final CRLF when that was still to come (no more reads)."""
    return event + b"\n" if event.endswith(b"\r") and b"\r\n" in event else event


def _event_too_large(limit: int) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"The provider sent a stream event larger than the gateway accepts ({limit} bytes); "
        "the stream was ended.",
        code="upstream_event_too_large",
    )
