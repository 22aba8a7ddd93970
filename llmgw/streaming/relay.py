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
- The upstream broke (cut off, stalled, an error event, an end without a finish): with a
  ``Continuation``, the answer is finished on another upstream stream (see
  ``streaming.continuation``) and the caller gets one whole answer; when it cannot be, the failure
  as it came (a provider's error event as it was sent).
- Anything else (a bound reached, shutdown, a failure of the gateway's own): an error event to the
  caller and ``failed``. Once the headers are sent, nothing but events is ever written.

An event whose data is not JSON is dropped (the caller could not parse it), counted and logged
once per request; the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson
from aiohttp import web

from llmgw.accounting.estimate import estimate_output_tokens
from llmgw.errors import GatewayError, InternalError, UpstreamTimeout, UpstreamUnavailable
from llmgw.providers.base import ChatStream, UpstreamHTTPError
from llmgw.providers.sse import EventTooLarge, SSEScanner
from llmgw.streaming.completion import completion_events
from llmgw.streaming.continuation import (
    MODE_PREFILL,
    MODE_RESTART,
    Continuation,
    Splice,
    Transcript,
)
from llmgw.streaming.observer import StreamObserver
from llmgw.streaming.summary import (
    CLIENT_CLOSED_REQUEST,
    StreamAttempt,
    StreamSummary,
    StreamTap,
)
from llmgw.streaming.supervisor import STREAMS, StreamSupervisor, gateway_shutting_down
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry import semconv as sc
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


# How a stream ended: its outcome, error type and status.
_Ending = tuple[str, str | None, int]


class _Broke(Exception):
    """The upstream's stream failed while being read (cut off, stalled): ``error`` says how."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.message)
        self.error = error


async def relay_stream(
    request: web.Request,
    upstream: ChatStream,
    observation: ChatObservation,
    *,
    hide_usage_chunk: bool,
    on_end: Callable[[StreamSummary], None],
    translator: StreamTranslator | None = None,
    continuation: Continuation | None = None,
    error_event: Callable[[GatewayError], bytes] = sse_error_event,
    tap: StreamTap | None = None,
) -> web.StreamResponse:
    """Send headers now, then every event as it completes; ``on_end`` is told once how it ended.

    Without a translator the caller gets the provider's events byte for byte (the continuation
    of a broken stream re-encoded); with one, what the translator makes of each decoded chunk
    (and its own opening, closing and error events). ``error_event`` renders the gateway's own
    failure without a translator, in the caller's API (a provider's error event goes as it came).
    """
    relay = _Relay(
        request.app[STREAMS], upstream, observation, hide_usage_chunk, translator, on_end
    )
    relay.continuation = continuation
    relay.error_event = error_event
    relay.tap = tap
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
        self._on_end = on_end
        self.continuation: Continuation | None = None
        self.error_event: Callable[[GatewayError], bytes] = sse_error_event
        self.tap: StreamTap | None = None
        self.transcript = Transcript()
        self.splice: Splice | None = None  # set while a continuation is relayed
        self.earlier: list[StreamAttempt] = []
        # Output tokens the caller had before the stream relayed now, which continues them (a
        # prefill); a restart spends them again, within its own count.
        self._spent_before = 0
        # A provider's error event, held back while the answer may still be finished elsewhere.
        self._held_error: bytes | None = None
        self.cut: GatewayError | None = None  # an event over the bound ended the stream
        self._malformed_logged = False

    async def run(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=STREAM_HEADERS)
        observer = self.observer
        # How the stream ended (outcome, error type, status), told once, in ``finally``; None:
        # the caller left before the usage came, and the drain tells it.
        ending: _Ending | None = (Outcome.FAILED, "internal_error", 200)
        error: GatewayError | None = None  # the error event the caller gets after the end
        try:
            await response.prepare(request)
            if self.translator is not None:
                await response.write(self.translator.start())
            async with self.streams.bounded():
                await self._relay_attempts(response)
            if self.translator is not None:
                await response.write(await self.translator.finish())
            elif not observer.done:  # a clean close after the finish chunk: complete
                await response.write(_DONE_EVENT)
            if self.tap is not None:
                self.tap.completed()
            ending = (Outcome.COMPLETED, None, 200)
        except GatewayError as failure:
            ending, error = (Outcome.FAILED, failure.error_kind, 200), failure
        except (ConnectionResetError, asyncio.CancelledError):
            ending = self._caller_left()
            raise
        except Exception:
            if not response.prepared:
                raise  # no headers sent: the error middleware answers
            # The gateway's own failure after the headers went out: the caller gets the API's
            # error event, never a second response written inside this one.
            log.exception("a relayed stream failed inside the gateway")
            error = InternalError("The gateway failed unexpectedly; see its logs.")
        finally:
            if ending is None:
                self.streams.drain(self._drain_usage())
            else:
                self._end(*ending)
                await self.upstream.close()
        if error is not None:
            await self._send_error(response, error)
        return response

    async def _relay_attempts(self, response: web.StreamResponse) -> None:
        """Relay the stream, and the continuations of a broken one, until the answer is whole;
        raise the failure when it cannot be made whole."""
        while True:
            try:
                await self._forward(response)
                broken = self._incomplete()
            except _Broke as broke:
                broken = broke.error
            if broken is None:
                return
            if self._budget_spent():
                await self._finish_at_length(response, broken)
                return
            if not await self._continue(broken):
                raise broken

    def _spent(self) -> int:
        """The output tokens of the caller's budget the answer has taken so far."""
        usage = self.observer.usage
        produced = (
            usage.output_tokens
            if usage is not None and usage.output_tokens is not None
            else estimate_output_tokens(self.observer.output_chars)
        )
        return self._spent_before + produced

    def _budget_spent(self) -> bool:
        """The broken answer could be continued, but the caller's budget has nothing left for it."""
        continuation = self.continuation
        return (
            continuation is not None
            and continuation.budget is not None
            and not self.observer.finished
            and self.transcript.why_not() is None
            and self._spent() >= continuation.budget
        )

    async def _finish_at_length(self, response: web.StreamResponse, broken: GatewayError) -> None:
        """End the answer as the provider would have at the caller's limit: a ``length`` finish."""
        await self.upstream.close()
        if self.tap is not None:
            self.tap.broken()  # its end is the gateway's, not the upstream's: not one to replay
        log.info("a stream broke (%s) with the caller's budget spent: ended at length", broken)
        self._note_continuation(broken, "budget spent", mode="none")
        observation = self.observer.observation
        chunk = {
            "id": observation.response_id or "",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": observation.response_model or "",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
        }
        event = b"data: " + orjson.dumps(chunk) + b"\n\n"
        self.observer.observe(event)
        self._held_error = None
        if self.translator is not None:
            await response.write(self.translator.feed(chunk))
        else:
            await response.write(event)

    def _incomplete(self) -> GatewayError | None:
        """Why the stream that ended is not a whole answer, or None when it is."""
        observer = self.observer
        if observer.upstream_error:
            return UpstreamUnavailable(
                "The provider reported an error in the stream.", code="upstream_stream_error"
            )
        if not observer.finished:
            # No finish reason: cut off, or a [DONE] (not relayed) that ends nothing.
            return UpstreamUnavailable(
                "The provider ended the stream before it was complete.",
                code="upstream_stream_incomplete",
            )
        return None

    async def _forward(self, response: web.StreamResponse) -> None:
        """Forward events until ``[DONE]``, an error event or the end of the upstream."""
        observer = self.observer
        async with contextlib.aclosing(self._upstream_bytes()) as source:
            while True:
                try:
                    data = await anext(source)
                except StopAsyncIteration:
                    return
                except (UpstreamUnavailable, UpstreamTimeout) as error:
                    raise _Broke(error) from error
                out: list[bytes] = []
                try:
                    for event in self._events(data):
                        shown = observer.observe(event)
                        if (
                            self.tap is not None
                            and observer.document is not None
                            and not observer.upstream_error
                        ):
                            self.tap.event(event)  # the usage chunk too, shown or not
                        if not shown:
                            continue
                        if observer.upstream_error:
                            self._held_error = event  # the caller's only if nothing finishes it
                            break
                        if observer.done and not observer.finished:
                            break  # the end of an unfinished answer: not relayed
                        forwarded = self._forwarded(event)
                        if forwarded:
                            out.append(forwarded)
                        if observer.done:
                            break
                finally:
                    # Even when a chunk is refused (a translator raised): what came before it
                    # reaches the caller ahead of the error event.
                    if out:
                        await response.write(b"".join(out))
                if observer.malformed and not self._malformed_logged:
                    self._malformed_logged = True
                    log.warning("a provider sent stream events that are not JSON; dropped")
                if observer.done or observer.upstream_error:
                    return
                if self.cut is not None:
                    raise self.cut

    def _forwarded(self, event: bytes) -> bytes:
        """What the caller is sent for one observed event."""
        document = self.observer.document
        if document is not None and self.continuation is not None:
            if self.splice is not None:
                document = self.splice.chunk(document)
                if document is None:
                    return b""  # nothing in it the caller does not have
            self.transcript.note(document)
        if self.translator is not None:
            return b"" if document is None else self.translator.feed(document)
        if self.splice is not None and document is not None:
            return b"data: " + orjson.dumps(document) + b"\n\n"
        return _complete_crlf(event) if self.observer.done else event

    async def _continue(self, broken: GatewayError) -> bool:
        """Finish the answer on a new upstream stream; False when it cannot be."""
        continuation = self.continuation
        if continuation is None or continuation.left <= 0 or self.observer.finished:
            return False  # (finished: the caller has the whole answer, and its finish)
        continuation.left -= 1
        why_not = self.transcript.why_not()
        if why_not is not None:
            log.info("a stream that broke %s was not continued (%s)", why_not, broken.message)
            self._note_continuation(broken, f"broke {why_not}", mode="none")
            return False
        text = self.transcript.text
        if self.tap is not None:
            self.tap.broken()  # spliced from two streams: not one answer to replay
        spent = self._spent()
        left = None if continuation.budget is None else continuation.budget - spent
        await self.upstream.close()
        try:
            resumed = await continuation.resume(text, left)
        except (GatewayError, UpstreamHTTPError) as error:
            # The failure the caller gets is the one that broke the stream, never this one (a
            # refused prefill, an unreachable fallback).
            log.warning("a broken stream could not be continued: %s", error)
            self._note_continuation(broken, "no deployment took it", mode="none")
            return False
        observer = self.observer
        self.earlier.append(
            StreamAttempt(
                continuation.deployment,
                observer.usage,
                observer.output_chars,
                error=broken.error_kind,
                response_model=observer.response_model,
            )
        )
        observer.next_attempt()
        self._spent_before = spent if resumed.prefilled else 0
        mode = MODE_PREFILL if resumed.prefilled else MODE_RESTART
        log.info(
            "a stream broken after %d characters (%s) is continued on %s (%s)",
            len(text),
            broken.error_kind,
            resumed.deployment,
            mode,
        )
        self._note_continuation(
            broken, "continued", mode=mode, chars=len(text), to=resumed.deployment
        )
        continuation.deployment = resumed.deployment
        self.upstream = resumed.stream
        self.scanner = SSEScanner(self.streams.max_event_bytes)
        self.splice = Splice(text, prefilled=resumed.prefilled)
        self._held_error = None
        return True

    def _note_continuation(
        self,
        broken: GatewayError,
        outcome: str,
        *,
        mode: str,
        chars: int | None = None,
        to: str | None = None,
    ) -> None:
        """The span's record of one break: why, what was done, on which deployment."""
        observation = self.observer.observation
        attributes: dict[str, str | int] = {
            sc.LLMGW_CONTINUATION_REASON: broken.error_kind,
            sc.LLMGW_CONTINUATION_MODE: mode,
            sc.LLMGW_CONTINUATION_OUTCOME: outcome,
        }
        if self.continuation is not None:
            attributes[sc.LLMGW_DEPLOYMENT] = self.continuation.deployment
        if chars is not None:
            attributes[sc.LLMGW_CONTINUATION_SENT_CHARS] = chars
        if to is not None:
            attributes[sc.LLMGW_CONTINUATION_DEPLOYMENT] = to
        observation.tracer_span.add_event(sc.EVENT_STREAM_CONTINUATION, attributes)
        observation.instruments.stream_continuations.add(
            1,
            {
                sc.GEN_AI_PROVIDER_NAME: observation.metric_attributes[sc.GEN_AI_PROVIDER_NAME],
                sc.LLMGW_CONTINUATION_OUTCOME: "continued" if outcome == "continued" else "failed",
            },
        )

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
        """The events complete in ``data``. Past an event over the bound, ``cut`` says the stream
        ends once those before it are relayed (and billed)."""
        try:
            return self.scanner.feed(data)
        except EventTooLarge as too_large:
            self.cut = _event_too_large(self.streams.max_event_bytes)
            return too_large.events

    def _caller_left(self) -> _Ending | None:
        """The caller hung up (or shutdown cut the handler): how the stream ended, or None to
        drain the rest for the usage (the answer was delivered, its usage not yet), or to its
        end for the tap (the response cache keeps only a stream read to its end)."""
        observer = self.observer
        if self.streams.shutdown_cut():
            return (Outcome.FAILED, gateway_shutting_down().error_kind, 200)
        if observer.done:
            if self.tap is not None and observer.finished and not observer.upstream_error:
                self.tap.completed()  # read to its end, the caller sent all of it
            return (Outcome.COMPLETED, None, 200)
        if observer.finished and observer.usage is not None and self.tap is None:
            return (Outcome.COMPLETED, None, 200)
        if not observer.finished or observer.upstream_error:
            return (Outcome.CANCELLED, "cancelled", CLIENT_CLOSED_REQUEST)
        return None  # drained: for its usage, and (a tap) to its end, to be kept

    async def _drain_usage(self) -> None:
        """Read the rest of an answer its caller no longer reads, for the provider's usage.

        The caller was sent the whole answer (its finish): read to its end, it is as complete
        as any, so the tap (the response cache) sees the rest and may keep it."""
        observer, tap = self.observer, self.tap
        try:
            async with asyncio.timeout(USAGE_DRAIN_SECONDS):
                async for data in self.upstream.chunks():
                    for event in self._events(data):
                        observer.observe(event)
                        if (
                            tap is not None
                            and observer.document is not None
                            and not observer.upstream_error
                        ):
                            tap.event(event)
                    if observer.upstream_error:
                        tap = None  # not an answer that ended normally
                    if self.cut is not None:
                        tap = None
                        break
                    # With a tap, read on to [DONE]: only a stream read to its end is kept.
                    if observer.done or (tap is None and observer.usage is not None):
                        break
            if tap is not None and observer.usage is not None:
                tap.completed()
        except (GatewayError, TimeoutError) as error:
            log.info("the usage of a stream whose caller left did not come (%s)", error)
        finally:
            await self.upstream.close()
            self._end(Outcome.COMPLETED)

    def _end(self, outcome: str, error_type: str | None = None, status: int = 200) -> None:
        """Tell ``on_end`` how the stream ended: each path of :meth:`run` comes here once."""
        observer = self.observer
        if observer.malformed:
            observation = self.observer.observation
            observation.tracer_span.set_attribute(
                sc.LLMGW_STREAM_MALFORMED_EVENTS, observer.malformed
            )
            observation.instruments.stream_malformed_events.add(
                observer.malformed,
                {sc.GEN_AI_PROVIDER_NAME: observation.metric_attributes[sc.GEN_AI_PROVIDER_NAME]},
            )
        self._on_end(
            StreamSummary(
                outcome=outcome,
                status=status,
                error_type=error_type,
                usage=observer.usage,
                output_chars=observer.output_chars,
                earlier=tuple(self.earlier),
                usage_final=observer.usage_final,
                response_id=observer.observation.response_id,
                # The last attempt's own model: a continuation's, never the start's.
                response_model=observer.response_model or observer.observation.response_model,
                first_chunk_at=observer.observation.first_chunk_at,
            )
        )

    def _error_event(self, error: GatewayError) -> bytes:
        if self.translator is not None:
            return self.translator.error(error)
        # A provider's own error event, as it sent it, when that is what ended the stream.
        return self._held_error or self.error_event(error)

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
