"""The one pipeline every proxied operation (chat, embeddings, messages, responses, media) goes
through.

    read the body → validate (→ translate) → route the model → admit (limits) → open the
    record and the observation → call the route → answer (→ translate back) → end the request

The pipeline owns the outcome: each stage writes what it learns into the request's
:class:`~llmgw.request_record.RequestRecord`, and every way a request can end (an
answer, a provider's refusal, a stream however it ended, the caller leaving, a failure of the
gateway's own) comes to :meth:`Exchange.end`, which ends it once: settle, ledger row (from the
record), span and metrics, billing line. An :class:`Operation` says what differs between JSON operations; an operation
whose body is not JSON (an upload) or whose answer is not (audio) reads its own body, starts with
:func:`start_call` and calls the provider through :func:`observe_upstream`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import orjson
from aiohttp import web
from opentelemetry import propagate, trace

from llmgw import app_keys
from llmgw.accounting.attempts import ANSWERED, BROKE, Attempt
from llmgw.accounting.charges import ESTIMATED, REPORTED, Charged, charge
from llmgw.accounting.estimate import (
    answer_output_chars,
    estimate_input_tokens,
    estimate_output_tokens,
)
from llmgw.accounting.metering import Meter
from llmgw.accounting.price import Metered, Price
from llmgw.accounting.usage import (
    NO_EXTRAS,
    Usage,
    UsageRecord,
    add_extras,
    anthropic_usage,
    parse_usage,
)
from llmgw.api.body import forget_raw_body, read_json_object, refuse_control_characters
from llmgw.api.codec import ApiCodec
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.cache.controls import read_controls
from llmgw.cache.entry import Entry
from llmgw.cache.flight import Flight, FlightFailed
from llmgw.cache.policy import CACHE_HEADER, MISS, Lookup
from llmgw.errors import GatewayError, InternalError, ProviderError, UpstreamUnavailable
from llmgw.limits.caps import CapHold
from llmgw.providers.base import (
    REASONING_PARAMS,
    ChatStream,
    Deployment,
    Provider,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
)
from llmgw.request_record import RequestRecord
from llmgw.routing.fallback import Answer, FallbackChain
from llmgw.streaming.continuation import (
    Continuation,
    Resumed,
    output_budget,
    with_output_budget,
)
from llmgw.streaming.relay import relay_stream, sse_error_event
from llmgw.streaming.replay import DONE_EVENT, replay_stream
from llmgw.streaming.summary import CLIENT_CLOSED_REQUEST, StreamAttempt, StreamSummary
from llmgw.streaming.translate import StreamTranslator
from llmgw.telemetry import semconv as sc
from llmgw.telemetry.genai import ChatObservation, Outcome

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "RECORD_NOT_COMPUTED",
    "Exchange",
    "Operation",
    "UpstreamRequest",
    "forward_upstream_error",
    "observe_upstream",
    "passed_headers",
    "proxy",
    "start_call",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

# The flag of a usage row whose figures could not be computed (an internal error while building
# it): the provider's reported usage as it came, no estimate, no price.
RECORD_NOT_COMPUTED = "record:not_computed"


@attrs.frozen
class Operation:
    """What one API operation adds to the pipeline."""

    name: str  # gen_ai.operation.name, and the first word of the span name
    validate: Callable[[dict[str, Any]], tuple[str, bool]]  # the body -> (model, stream)
    complete: Callable[[Provider, UpstreamCall], Awaitable[UpstreamResponse]]  # not streamed
    produces_output: bool = True  # False: no output tokens (embeddings, images)
    # Another API served through chat completions (or a provider's own dialect of it): the
    # request, answers and errors translated.
    codec: ApiCodec | None = None
    open_stream: Callable[[Provider, UpstreamCall], Awaitable[ChatStream]] = lambda provider, call: (
        provider.stream_chat_completion(call)
    )
    # False: the provider is sent another API's body (no stream_options, no capability checks).
    sends_chat: bool = True
    meter: Meter | None = None  # a media call: billed by what it returns, not by tokens
    # The caller's headers (lower-case names) the provider is sent with that body: those of its
    # API that say how to read it (``anthropic-beta``). See UpstreamCall.caller_headers.
    caller_headers: tuple[str, ...] = ()
    # The API's name in the response cache's keys (llmgw.cache.key); None: never cached.
    cache_api: str | None = None
    # The gateway's own error in a stream relayed as the provider sent it (no codec), in the
    # caller's API: chat's ``data: {"error": ...}`` unless said.
    stream_error_event: Callable[[GatewayError], bytes] = sse_error_event
    # What ends a replayed stream (no codec): chat's ``[DONE]`` unless the API's events end it.
    replay_end: bytes = DONE_EVENT


def passed_headers(request: web.Request, names: tuple[str, ...]) -> dict[str, str]:
    """The caller's headers ``names`` as one value each: a header sent on several lines is its
    values joined by commas, which is what it means in HTTP (RFC 9110 5.3; an SDK sends
    ``anthropic-beta`` so too), not its first line alone."""
    return {
        name: ",".join(request.headers.getall(name)) for name in names if name in request.headers
    }


def forward_upstream_error(response: UpstreamResponse) -> web.Response:
    """The provider's own status and body, untouched, so clients see exactly what it said."""
    headers = {"Content-Type": response.content_type}
    if response.retry_after is not None:
        headers["Retry-After"] = response.retry_after
    return web.Response(status=response.status, body=response.body, headers=headers)


@attrs.define(slots=True)
class Exchange:
    """One proxied request from its admission to its one usage record."""

    request: web.Request
    key: AuthenticatedKey
    body: dict[str, Any]
    observation: ChatObservation
    record: RequestRecord  # what the ledger row is made of
    deployment: Deployment | None = None  # the one that answered
    provider_worked: bool = False  # a deployment accepted the request: it bills it
    output_chars: int = 0  # what the provider produced, for an estimate
    usage_final: bool = True  # see StreamSummary.usage_final
    # Streams that broke before the one that finished the answer: billed with it.
    earlier: tuple[StreamAttempt, ...] = ()
    release_deployment: Callable[[float | None], None] = lambda _: None  # see Answer.done
    answered_at: float = 0.0  # perf_counter, as the observation's chunk times
    # A media call's billed quantity: the request's (its worst case) until the answer says.
    metered: Metered | None = None
    # Each answering deployment's hold on its provider's account caps (None: not capped), in the
    # order they answered: the broken streams' (``earlier``), then the one that finished.
    cap_holds: list[CapHold | None] = attrs.Factory(list)
    # Every deployment the request was sent to, in order, and how each ended.
    attempts: list[Attempt] = attrs.Factory(list)
    # Each of those holds with the tokens its attempt used, once the record is made.
    caps_used: list[tuple[CapHold | None, int]] = attrs.Factory(list)
    # The response cache's lookup whose answer this request fetches (a miss, or no-cache), and
    # the JSON answer to store (a stream's events are recorded by the lookup itself).
    cache: Lookup | None = None
    cache_body: bytes | None = None

    def _estimate(self) -> tuple[int, int]:
        return estimate_input_tokens(self.body), estimate_output_tokens(self.output_chars)

    def stream_ended(self, summary: StreamSummary) -> None:
        """The relay's one report of how the stream ended (possibly after a background drain)."""
        record = self.record
        record.usage = summary.usage
        self.output_chars = summary.output_chars
        self.usage_final = summary.usage_final
        self.earlier = summary.earlier
        record.response_id, record.response_model = summary.response_id, summary.response_model
        record.first_chunk_at = summary.first_chunk_at
        self.end(summary.status, summary.outcome, summary.error_type)

    def deployment_tried(self, deployment: Deployment, tried: int) -> None:
        """The route is about to call its ``tried``-th deployment: it answers unless it fails too."""
        record = self.record
        provider = deployment.provider
        record.provider, record.provider_cost_report = provider.name, provider.cost_report
        record.deployment, record.deployments_tried = deployment.label, tried
        self.observation.deployment_tried(deployment, tried)

    def attempt_started(self, deployment: Deployment, _tried: int = 0) -> None:
        """The route sends the request to ``deployment`` (``UpstreamCall.on_deployment``)."""
        self.attempts.append(Attempt(deployment.label, deployment.provider.name, deployment.model))
        self.deployment_tried(deployment, len(self.attempts))

    def attempt_failed(self, deployment: Deployment, error: str, status: int | None) -> None:
        """That attempt failed (``UpstreamCall.on_failure``)."""
        if self.attempts:
            self.attempts[-1].failed(error, status)

    def answered(self, answer: Answer[T]) -> T:
        """The route answered: that deployment bills the request, whatever happens next."""
        if self.attempts:  # (a call built without the exchange's hooks tells nothing)
            self.attempts[-1].ended = ANSWERED
        self._release_deployment()  # a stream that broke off, when this one continues it
        self.deployment = answer.deployment
        self.cap_holds.append(answer.cap)
        self.release_deployment = answer.done
        self.answered_at = time.perf_counter()
        self.provider_worked = True
        if answer.omitted:
            # Said, not hidden: the caller (a response header) and the trace see what was left out.
            self.request[app_keys.OMITTED_PARAMS] = answer.omitted
            self.observation.tracer_span.set_attribute(sc.LLMGW_OMITTED_PARAMS, answer.omitted)
        return answer.result

    def _release_deployment(self) -> None:
        """The deployment that answered is done with the request, timed to its first chunk (a
        continuation's first chunk is the broken stream's: it is timed to its answer only)."""
        first_chunk_at = self.observation.first_chunk_at
        self.release_deployment(
            None
            if first_chunk_at is None or first_chunk_at < self.answered_at
            else first_chunk_at - self.answered_at
        )
        self.release_deployment = lambda _: None

    def _price(self) -> Price | None:
        if self.deployment is None:
            return None
        return self._price_of(self.deployment.provider.name, self.deployment.model)

    def _price_of(self, provider: str, model: str) -> Price | None:
        prices = self.request.app[app_keys.LIMITS].prices
        prices.warm()  # a price from a listing not fetched yet is there for the next request
        return prices.price(provider, model)

    def end(
        self, status: int, outcome: str, error_type: str | None = None, *, hit: Entry | None = None
    ) -> None:
        """End the request: the one place every way a request can end comes to, once.

        In order, and from the record alone: settle what it reserved (its admission and its
        provider caps), queue its ledger row, end its span and record its metrics, write its
        billing line. Whatever fails on the way, a request that reached a provider is in the
        ledger and what it reserved is settled. ``hit``: the cache answered, with that entry.
        """
        record = self.record
        if record.ended:
            return
        record.ended = True
        record.status, record.outcome, record.error_type = status, outcome, error_type
        self._release_deployment()
        observation = self.observation
        try:
            row = self._row() if hit is None else self._hit_row(hit)
        except Exception:
            log.exception("the usage record of request %s could not be built", record.request_id)
            row = self._bare_row()
        self._settle_cache(row)
        accounting = self.request.app[app_keys.USAGE]
        fields = accounting.settle(row, record.ticket, self.caps_used)
        if RECORD_NOT_COMPUTED in row.flags:
            observation.abandon()  # no figures to show
        else:
            try:
                observation.finish(status=status, outcome=outcome, error_type=error_type)
            except Exception:
                log.exception("the span of request %s could not be finished", record.request_id)
                observation.abandon()
        accounting.log(fields)

    def _hit_row(self, entry: Entry) -> UsageRecord:
        """The row of a request the cache answered: the stored answer's tokens, no provider
        cost, and the cost it saved."""
        usage = entry.usage
        self.record.response_model = self.observation.response_model = entry.response_model
        return self.record.usage_row(
            attrs.evolve(usage, cost_usd=0.0, extras=NO_EXTRAS),
            cache_hit=True,
            saved_cost_usd=usage.cost_usd,
        )

    def _settle_cache(self, record: UsageRecord) -> None:
        """A complete answer with the provider's own usage is shared with the requests that
        wait for it and stored; anything else is not, and they call on their own."""
        lookup, self.cache = self.cache, None
        if lookup is None:
            return
        cache = self.request.app[app_keys.CACHE]
        if (
            record.status != 200
            or record.outcome != Outcome.COMPLETED
            or record.usage_source != REPORTED
            or (self.cache_body is None and not record.stream)
        ):
            cache.abandon(lookup)
            return
        cache.settle(
            lookup,
            usage=Usage(
                input_tokens=record.input_tokens,
                output_tokens=record.output_tokens,
                cache_read_input_tokens=record.cache_read_input_tokens,
                cache_creation_input_tokens=record.cache_creation_input_tokens,
                cache_creation_1h_input_tokens=record.cache_creation_1h_input_tokens,
                reasoning_output_tokens=record.reasoning_output_tokens,
                cost_usd=record.cost_usd,
            ),
            body=self.cache_body,
            response_model=record.response_model,
        )

    def _row(self) -> UsageRecord:
        record = self.record
        if self.earlier:
            charged, each = self._charge_attempts()
        else:
            charged = charge(
                record.usage,
                provider_worked=self.provider_worked,
                estimate=self._estimate,
                price=self._price,
                metered=self.metered,
                final=self.usage_final,
            )
            each = [charged]
        self.caps_used = self._caps_used([c.usage for c in each])
        self._log_answers(each, record)
        source = record.usage_source = charged.source
        # What the span shows: the provider's figures, or the gateway's tokens without a cost.
        shown = charged.usage if self.earlier else record.usage
        self.observation.usage = (
            shown
            if source == REPORTED
            else attrs.evolve(charged.usage, cost_usd=None, extras=NO_EXTRAS)
        )
        self.observation.usage_source = source
        return record.usage_row(
            charged.usage,
            usage_source=source,
            attempts=max(1, len(self.attempts)),
            started_deployment=self.earlier[0].deployment if self.earlier else None,
            attempt_log=tuple(map(Attempt.as_json, self.attempts)),
            cost_computed=charged.cost_computed,
            flags=charged.flags,
        )

    def _answering(self) -> list[Attempt]:
        """The attempts that answered, in order: the broken streams', then the last one's."""
        return [a for a in self.attempts if a.ended == ANSWERED]

    def _log_answers(self, each: list[Charged], record: RequestRecord) -> None:
        """How each attempt that answered ended, with what it produced (``each``, in order)."""
        answering = self._answering()
        for attempt, charged in zip(answering, each, strict=False):
            attempt.usage, attempt.estimated = charged.usage, charged.source == ESTIMATED
        for attempt, broken in zip(answering, self.earlier, strict=False):
            attempt.ended, attempt.error = BROKE, broken.error
            attempt.response_model = broken.response_model
        if len(answering) > len(self.earlier):  # the last one ended the request
            last = answering[-1]
            last.ended, last.status, last.error = record.outcome, record.status, record.error_type
            last.response_model = record.response_model

    def _caps_used(self, attempts: list[Usage]) -> list[tuple[CapHold | None, int]]:
        """Each answering deployment's account-cap hold with the tokens its attempt used
        (``attempts``: their usage, in the order they answered), for the ticket to settle."""
        return [
            (hold, (usage.input_tokens or 0) + (usage.output_tokens or 0))
            for hold, usage in zip(self.cap_holds, attempts, strict=False)
            if hold is not None
        ]

    def _charge_attempts(self) -> tuple[Charged, list[Charged]]:
        """A continued answer's charge: each stream attempt charged on its own, at its own
        deployment's price (an attempt that reported nothing is estimated), and their sum."""
        input_estimate = estimate_input_tokens(self.body)
        parts = [(a.usage, a.output_chars, True) for a in self.earlier]
        parts.append((self.record.usage, self.output_chars, self.usage_final))
        answering = self._answering()
        each: list[Charged] = []
        for index, (usage, output_chars, final) in enumerate(parts):
            attempt = answering[index] if index < len(answering) else None
            price = (
                self._price
                if attempt is None
                else functools.partial(self._price_of, attempt.provider, attempt.model)
            )
            estimate = functools.partial(
                _tokens, input_estimate, estimate_output_tokens(output_chars)
            )
            each.append(
                charge(usage, provider_worked=True, estimate=estimate, price=price, final=final)
            )
        total = Usage(input_tokens=0, output_tokens=0, cost_usd=0.0)
        for charged in each:
            usage = charged.usage
            total = Usage(
                input_tokens=_plus(total.input_tokens, usage.input_tokens),
                output_tokens=_plus(total.output_tokens, usage.output_tokens),
                cache_read_input_tokens=_plus(
                    total.cache_read_input_tokens, usage.cache_read_input_tokens
                ),
                cache_creation_input_tokens=_plus(
                    total.cache_creation_input_tokens, usage.cache_creation_input_tokens
                ),
                cache_creation_1h_input_tokens=_plus(
                    total.cache_creation_1h_input_tokens, usage.cache_creation_1h_input_tokens
                ),
                reasoning_output_tokens=_plus(
                    total.reasoning_output_tokens, usage.reasoning_output_tokens
                ),
                # Known only when every attempt's cost is (reported or priced).
                cost_usd=None
                if total.cost_usd is None or usage.cost_usd is None
                else total.cost_usd + usage.cost_usd,
                extras=add_extras(total.extras, usage.extras),
            )
        # Partly estimated (an attempt that broke before reporting) is estimated.
        estimated = any(c.source == ESTIMATED for c in each)
        flags = tuple(dict.fromkeys(flag for c in each for flag in c.flags))
        charged = Charged(
            total,
            ESTIMATED if estimated else REPORTED,
            cost_computed=any(c.cost_computed for c in each),
            flags=flags,
        )
        return charged, each

    def _bare_row(self) -> UsageRecord:
        """The row from what is known without computing anything that could fail again: the
        usage as far as it got (the provider's, or the estimate if that was made; none: no
        tokens), flagged so the row can be found."""
        record = self.record
        return record.usage_row(
            record.usage or Usage(),
            usage_source=record.usage_source,
            flags=(RECORD_NOT_COMPUTED,),
        )


async def proxy(
    request: web.Request, key: AuthenticatedKey, operation: Operation
) -> web.StreamResponse:
    raw, body = await read_json_object(request)
    model, stream = operation.validate(body)
    caller_body, codec = body, operation.codec
    if codec is not None:
        body = codec.to_chat(body)
    # Token counts for every stream: ask for usage even when the caller did not, and hide the
    # usage-only chunk from a caller who did not ask for it.
    hide_usage_chunk = stream and operation.sends_chat and not _caller_asked_for_usage(body)
    if hide_usage_chunk:
        options = body.get("stream_options")
        body["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    if hide_usage_chunk or codec is not None:
        # Sent re-encoded: the raw body can go before the new one is made (a large body's copy
        # less at the peak).
        del raw
        forget_raw_body(request)
        sent = orjson.dumps(body)
    else:
        sent = raw
    reasoning = tuple(p for p in REASONING_PARAMS if p in body) if operation.sends_chat else ()
    upstream = UpstreamRequest(
        operation.name,
        model,
        stream,
        body,
        sent,
        produces_output=operation.produces_output,
        reasoning_params=reasoning,
        metered=None if operation.meter is None else operation.meter.requested(body),
        caller_headers=passed_headers(request, operation.caller_headers),
    )
    app = request.app  # read once: each read is two property calls
    route = _route(request, app, upstream)
    cache = app.get(app_keys.CACHE)
    lookup: Lookup | None = None
    if cache is not None and operation.cache_api is not None:
        # Read before the model's limits are reserved: a stored answer uses no tokens or spend.
        lookup = await cache.lookup(
            api=operation.cache_api,
            model=model,
            body=caller_body,
            key_id=str(key.id),
            subject_id=None if key.subject_id is None else str(key.subject_id),
            controls=read_controls(request.headers),
            team_id=None if key.team is None else str(key.team.id),
        )
    try:
        exchange = await _open_exchange(
            request,
            app,
            key,
            upstream,
            route,
            # A follower of an identical request in flight is a hit too: no tokens or spend,
            # unless that request's answer does not come (reserve_call, below).
            stored_answer=lookup is not None
            and (lookup.entry is not None or lookup.follows is not None),
        )
    except BaseException:
        if lookup is not None and cache is not None:
            cache.abandon(lookup)  # refused: those following it call on their own
        raise
    translate_errors = codec is not None

    def translator() -> StreamTranslator | None:
        return (
            codec.stream_translator(
                request=caller_body, estimated_input_tokens=estimate_input_tokens(body)
            )
            if codec is not None
            else None
        )

    if lookup is not None:
        cached = await _from_cache(
            lookup, operation, exchange, caller_body, stream, hide_usage_chunk, translator
        )
        if cached is not None:
            return cached
        if lookup.follows is not None:
            # The answer it followed did not come: it calls after all, with its tokens.
            try:
                await exchange.record.ticket.reserve_call(
                    model=upstream.model,
                    body=upstream.fields,
                    deployments=route.deployments,
                    produces_output=upstream.produces_output,
                    metered=upstream.metered,
                )
            except BaseException as error:
                exchange.end(*_how_it_failed(error))
                raise
    call = _upstream_call(app, exchange, upstream)  # made once the cache has not answered
    try:
        if not stream:
            return await observe_upstream(
                exchange,
                functools.partial(_complete, operation, route, call, exchange, caller_body),
                translate_errors=translate_errors,
            )
        return await _stream(
            request, operation, route, call, exchange, hide_usage_chunk, translator()
        )
    finally:
        if exchange.cache is not None and cache is not None:
            cache.abandon(exchange.cache)  # whatever ended it without an answer to share


async def _from_cache(
    lookup: Lookup,
    operation: Operation,
    exchange: Exchange,
    caller_body: dict[str, Any],
    stream: bool,
    hide_usage_chunk: bool,
    translator: Callable[[], StreamTranslator | None],
) -> web.StreamResponse | None:
    """The answer the cache's ``lookup`` found (a stored one, or one in flight), or None: the
    request calls the provider, and ``exchange.cache`` says whether its answer is to be stored."""
    request = exchange.request
    headers = request.setdefault(app_keys.RESPONSE_HEADERS, {})
    headers[CACHE_HEADER] = lookup.result
    exchange.observation.tracer_span.set_attribute(sc.LLMGW_CACHE_RESULT, lookup.result)
    entry = lookup.entry
    if lookup.follows is not None:
        if stream and await lookup.follows.first_event():
            headers["Age"] = "0"
            return await _replay(
                exchange, operation, lookup.follows, hide_usage_chunk, translator()
            )
        if not stream:
            entry = await lookup.follows.answer()
        if entry is None:
            # The leader's call failed: this one calls on its own (and shares with no one).
            headers[CACHE_HEADER] = MISS
            exchange.observation.tracer_span.set_attribute(sc.LLMGW_CACHE_RESULT, MISS)
            return None
    if entry is None:
        if lookup.key is not None and (lookup.leads is not None or lookup.ttl > 0):
            exchange.cache = lookup
        return None
    headers["Age"] = str(int(lookup.age))
    if stream:
        return await _replay(exchange, operation, entry, hide_usage_chunk, translator())
    try:
        body = entry.json_body()
        if operation.codec is not None:
            body = await _translate(operation.codec, orjson.loads(body), caller_body, "the cache")
    except BaseException:
        exchange.end(500, Outcome.FAILED, "internal_error", hit=entry)
        raise
    exchange.end(200, Outcome.COMPLETED, hit=entry)
    return web.Response(body=body, content_type="application/json")


async def _followed(flight: Flight) -> AsyncIterator[bytes]:
    try:
        async for event in flight.stream():
            yield event
    except FlightFailed:
        raise UpstreamUnavailable(
            "The provider ended the stream before it was complete.",
            code="upstream_stream_incomplete",
        ) from None


async def _replay(
    exchange: Exchange,
    operation: Operation,
    answer: Entry | Flight,
    hide_usage_chunk: bool,
    translator: StreamTranslator | None,
) -> web.StreamResponse:
    """A hit (a stored entry) or a follower (the flight it follows), streamed; its one record
    made when the stream ends."""
    events = answer.chunk_events() if isinstance(answer, Entry) else _followed(answer)
    failed: GatewayError | None = None
    cancelled = False
    try:
        response, failed = await replay_stream(
            exchange.request,
            events,
            hide_usage_chunk=hide_usage_chunk,
            translator=translator,
            error_event=operation.stream_error_event,
            end=operation.replay_end,
        )
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        cancelled = True
        raise
    except BaseException:
        failed = InternalError("The gateway failed unexpectedly; see its logs.")
        raise
    finally:
        entry = answer if isinstance(answer, Entry) else answer.entry
        ending: tuple[int, str, str | None]
        if entry is None:  # the leader's stream broke: nothing was answered, nothing is billed
            ending = (
                (CLIENT_CLOSED_REQUEST, Outcome.CANCELLED, "cancelled")
                if cancelled
                else (200, Outcome.FAILED, "upstream_stream_incomplete")
            )
        elif cancelled:
            ending = (CLIENT_CLOSED_REQUEST, Outcome.CANCELLED, "cancelled")
        elif failed is not None:
            ending = (200, Outcome.FAILED, failed.error_kind)
        else:
            ending = (200, Outcome.COMPLETED, None)
        exchange.end(*ending, hit=entry)


@attrs.frozen
class UpstreamRequest:
    """What an operation sends once its body is read and checked."""

    operation: str  # gen_ai.operation.name
    model: str
    stream: bool
    fields: dict[str, Any]  # the request's fields: span attributes and the admission's estimate
    body: bytes  # what is sent
    content_type: str = "application/json"
    encode_for_model: Callable[[str], bytes] | None = None  # for bodies that are not JSON
    produces_output: bool = True  # False: no output tokens to reserve
    reasoning_params: tuple[str, ...] = ()  # see UpstreamCall.reasoning_params
    metered: Metered | None = None  # a media call: what it is billed by, at most
    caller_headers: dict[str, str] = attrs.field(factory=dict)  # see UpstreamCall.caller_headers


async def start_call(
    request: web.Request, key: AuthenticatedKey, upstream: UpstreamRequest
) -> tuple[FallbackChain, UpstreamCall, Exchange]:
    """Route, admit and open the observation: what every operation shares once its body is read.

    Returns the route, the call to send it, and the exchange, which the caller finishes (through
    :func:`observe_upstream` on failure).
    """
    app = request.app
    route = _route(request, app, upstream)
    exchange = await _open_exchange(request, app, key, upstream, route)
    return route, _upstream_call(app, exchange, upstream), exchange


def _route(request: web.Request, app: web.Application, upstream: UpstreamRequest) -> FallbackChain:
    """The route of ``upstream``'s model, once the key is known to be allowed it (``app``: the
    request's)."""
    refuse_control_characters(upstream.model)
    route = app[app_keys.PROVIDERS].resolve(upstream.model)
    request[app_keys.TICKET].allow_model(upstream.model)
    return route


async def _open_exchange(
    request: web.Request,
    app: web.Application,
    key: AuthenticatedKey,
    upstream: UpstreamRequest,
    route: FallbackChain,
    *,
    stored_answer: bool = False,
) -> Exchange:
    """:func:`start_call` without the call: the model's limits reserved (``stored_answer``: the
    cache answers it, see :meth:`Ticket.reserve`) and the request's record and observation
    opened (``app``: the request's)."""
    ticket = request[app_keys.TICKET]  # the middleware's admission
    await ticket.reserve(
        model=upstream.model,
        body=upstream.fields,
        deployments=route.deployments,
        produces_output=upstream.produces_output,
        metered=upstream.metered,
        stored_answer=stored_answer,
    )
    try:
        telemetry = app[app_keys.TELEMETRY]
        observation = ChatObservation.start(
            telemetry.tracer,
            telemetry.instruments,
            operation=upstream.operation,
            provider_name=route.name,
            server_address=route.server_address,
            server_port=route.server_port,
            provider_cost_report=route.cost_report,
            body=upstream.fields,
            model=upstream.model,
            stream=upstream.stream,
            capture_content=telemetry.capture_content,
        )
        context = observation.tracer_span.get_span_context()
        record = RequestRecord(
            ticket=ticket,
            request_id=request[app_keys.REQUEST_ID],
            api_key_id=key.id,
            subject_id=key.subject_id,
            operation=upstream.operation,
            model=upstream.model,
            stream=upstream.stream,
            provider=route.name,
            provider_cost_report=route.cost_report,
            trace_id=format(context.trace_id, "032x") if context.is_valid else None,
            started=observation.started,
        )
        exchange = Exchange(
            request, key, upstream.fields, observation, record, metered=upstream.metered
        )
    except BaseException:
        ticket.settle(None)  # nothing was used: give it back
        raise
    return exchange


def _tokens(input_tokens: int, output_tokens: int) -> tuple[int, int]:
    return input_tokens, output_tokens


def _plus(total: int | None, count: int | None) -> int | None:
    return total if count is None else (total or 0) + count


def _caller_asked_for_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _upstream_call(
    app: web.Application, exchange: Exchange, upstream: UpstreamRequest
) -> UpstreamCall:
    """The call that sends ``upstream`` for ``exchange`` (a failure to make it ends the request;
    ``app``: the request's)."""
    try:
        trace_headers: dict[str, str] = {}
        span = exchange.observation.tracer_span
        propagate.inject(trace_headers, context=trace.set_span_in_context(span))
        settings = app[app_keys.SETTINGS]
        return UpstreamCall(
            body=upstream.body,
            deadline=asyncio.get_running_loop().time() + settings.request_timeout_seconds,
            trace_headers=trace_headers,
            model=upstream.model,
            on_deployment=exchange.attempt_started,
            on_failure=exchange.attempt_failed,
            content_type=upstream.content_type,
            encode_for_model=upstream.encode_for_model,
            reasoning_params=upstream.reasoning_params,
            caller_headers=upstream.caller_headers,
            caller=str(exchange.key.id),
            admission=exchange.record.ticket,  # routing counts provider account caps on it
        )
    except BaseException:
        exchange.end(500, Outcome.FAILED, "internal_error")
        raise


async def _open_stream(
    operation: Operation, route: FallbackChain, call: UpstreamCall, exchange: Exchange
) -> ChatStream:
    return exchange.answered(await route.first_answer(call, operation.open_stream))


async def _stream(
    request: web.Request,
    operation: Operation,
    route: FallbackChain,
    call: UpstreamCall,
    exchange: Exchange,
    hide_usage_chunk: bool,
    translator: StreamTranslator | None,
) -> web.StreamResponse:
    opened = await observe_upstream(
        exchange,
        functools.partial(_open_stream, operation, route, call, exchange),
        translate_errors=translator is not None,
    )
    if isinstance(opened, web.StreamResponse):
        return opened  # the provider's error, forwarded
    exchange.observation.retries = opened.retries
    continuation = None
    if operation.sends_chat and exchange.deployment is not None:
        # A stream that breaks may be finished on each deployment of the route in turn (on its
        # only one once).
        continuation = Continuation(
            resume=functools.partial(_resume, operation, route, call, exchange),
            deployment=exchange.deployment.label,
            left=len(route.deployments),
            budget=output_budget(exchange.body),
        )
    # From here the relay tells how the stream ended, once, possibly after the caller left.
    return await relay_stream(
        request,
        opened,
        exchange.observation,
        hide_usage_chunk=hide_usage_chunk,
        on_end=exchange.stream_ended,
        tap=exchange.cache,
        translator=translator,
        continuation=continuation,
        error_event=operation.stream_error_event,
    )


async def _resume(
    operation: Operation,
    route: FallbackChain,
    call: UpstreamCall,
    exchange: Exchange,
    text: str,
    left: int | None,
) -> Resumed:
    """A new stream for the rest of an answer whose stream broke after ``text`` was sent, with
    ``left`` output tokens of the caller's budget: on the deployments of the route the request
    has not been sent to yet (see FallbackChain.after), with a deadline of its own."""
    broken = exchange.deployment
    assert broken is not None  # a stream was relayed, so a deployment answered
    tried = exchange.record.deployments_tried
    chain = route.after(broken, {attempt.deployment for attempt in exchange.attempts})
    if chain is None:
        raise UpstreamUnavailable(
            "Every deployment of the route has failed in this request.",
            code="upstream_stream_interrupted",
        )
    await exchange.record.ticket.reserve_more(
        model=exchange.record.model,
        body=_continued_at_worst(exchange.body, text, left, chain.deployments),
        deployments=chain.deployments,
    )
    settings = exchange.request.app[app_keys.SETTINGS]
    resumed_call = attrs.evolve(
        call, deadline=asyncio.get_running_loop().time() + settings.request_timeout_seconds
    )
    try:
        answer = await chain.first_answer(
            resumed_call, functools.partial(_open_continuation, operation, text, left)
        )
    except BaseException:
        # Not finished: the request stays the broken deployment's, in the span and the ledger.
        exchange.deployment_tried(broken, tried)
        raise
    stream = exchange.answered(answer)
    return Resumed(stream, answer.deployment.label, prefilled=_prefills(answer.deployment, text))


def _continued_at_worst(
    body: dict[str, Any], text: str, left: int | None, deployments: Sequence[Deployment]
) -> dict[str, Any]:
    """The most a continuation of ``text`` on one of ``deployments`` can be billed for, as a chat
    body: the prompt again with the text so far, and what is left of the output budget, or the
    whole of it when a deployment restarts the answer."""
    messages = body.get("messages")
    worst = {
        **body,
        "messages": [*(messages if isinstance(messages, list) else ()), _assistant(text)],
    }
    if left is not None and all(_prefills(d, text) for d in deployments):
        worst = with_output_budget(worst, left)
    return worst


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _prefills(deployment: Deployment, text: str) -> bool:
    return bool(text) and deployment.provider.capabilities.prefill


async def _open_continuation(
    operation: Operation, text: str, left: int | None, provider: Provider, call: UpstreamCall
) -> ChatStream:
    """The stream that continues ``text``: the request plus ``text`` as the assistant's message
    to continue, asking for the ``left`` output tokens of the caller's budget, when the provider
    continues one; else the request again (a restart, which spends the whole budget again)."""
    if text and provider.capabilities.prefill:
        document = orjson.loads(call.body)
        document["messages"] = [*document["messages"], _assistant(text)]
        if left is not None:
            document = with_output_budget(document, left)
        call = attrs.evolve(call, body=orjson.dumps(document))
    return await operation.open_stream(provider, call)


def _finished(document: dict[str, Any]) -> bool:
    """A whole answer: every choice of a completion ended (an embedding has none), a Messages
    answer stopped, a Response completed (not incomplete, failed or still in progress)."""
    if document.get("type") == "message":
        return document.get("stop_reason") is not None
    if document.get("object") == "response":
        return document.get("status") == "completed"
    choices = document.get("choices")
    if choices is None:
        return True
    return isinstance(choices, list) and all(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices
    )


async def _complete(
    operation: Operation,
    route: FallbackChain,
    call: UpstreamCall,
    exchange: Exchange,
    caller_body: dict[str, Any],
) -> web.StreamResponse:
    observation = exchange.observation
    result = exchange.answered(await route.first_answer(call, operation.complete))
    observation.retries = result.retries
    answered_by = exchange.record.provider
    try:
        document = orjson.loads(result.body)
    except orjson.JSONDecodeError:
        raise UpstreamUnavailable(
            f"{answered_by} answered with a body that is not JSON.",
            code="upstream_invalid_response",
        ) from None
    if not isinstance(document, dict):
        raise UpstreamUnavailable(
            f"{answered_by} answered with an unexpected JSON value.",
            code="upstream_invalid_response",
        )
    observation.note_document(document)
    record = exchange.record
    record.note_ids(document)
    observation.response_id, observation.response_model = record.response_id, record.response_model
    usage = document.get("usage")
    record.usage = (
        # A Messages answer (a provider that speaks Messages itself) counts input its own way.
        anthropic_usage(usage)
        if document.get("type") == "message" and isinstance(usage, dict)
        else parse_usage(document, cost=record.provider_cost_report)
    )
    exchange.output_chars = answer_output_chars(document)
    if operation.meter is not None:
        exchange.metered = operation.meter.answered(document) or exchange.metered
    # Translated before the request ends: an answer that cannot be translated is recorded as
    # the failure the caller gets (with the usage the provider reported), not as a success.
    if exchange.cache is not None and result.status == 200 and _finished(document):
        exchange.cache_body = result.body  # the provider's own bytes: a hit sends them as they are
    if operation.codec is None:
        body, content_type = result.body, result.content_type
    else:
        body = await _translate(operation.codec, document, caller_body, answered_by)
        content_type = "application/json"
    return web.Response(status=result.status, body=body, headers={"Content-Type": content_type})


async def _translate(
    codec: ApiCodec, document: dict[str, Any], caller_body: dict[str, Any], answered_by: str
) -> bytes:
    try:
        return await codec.from_chat(document, request=caller_body)
    except orjson.JSONEncodeError:
        # What orjson reads (1,024 levels) but cannot write (254): only a provider's answer can
        # nest that deeply, since request bodies are bounded far below (MAX_JSON_DEPTH).
        raise UpstreamUnavailable(
            f"{answered_by} answered with JSON nested too deeply to relay.",
            code="upstream_invalid_response",
        ) from None


async def observe_upstream(
    exchange: Exchange,
    call: Callable[[], Awaitable[T]],
    *,
    translate_errors: bool,
) -> T | web.Response:
    """Run ``call``, and end the request if it answered (a response, not a stream to relay) or
    failed.

    A provider's error passes through as it is, or (``translate_errors``) as a ProviderError the
    error middleware renders in the route's own error shape.
    """
    try:
        result = await call()
    except BaseException as exc:
        status, outcome, error_type = _how_it_failed(exc)
        if isinstance(exc, UpstreamHTTPError):
            exchange.observation.retries = exc.response.retries
        exchange.end(status, outcome, error_type)
        if not isinstance(exc, UpstreamHTTPError):
            raise
        if translate_errors:
            response = exc.response
            raise ProviderError.from_answer(
                response.status, response.body, retry_after=response.retry_after
            ) from None
        return forward_upstream_error(exc.response)
    if isinstance(result, web.Response):
        # A freed concurrency slot needs no turn of the loop before the answer: this replica's
        # next admission carries the settlement to the store ahead of itself (LimitPolicy).
        exchange.end(result.status, Outcome.COMPLETED)
    return result


def _how_it_failed(exc: BaseException) -> tuple[int, str, str]:
    """The status, outcome and error type of a request that ``exc`` ended."""
    if isinstance(exc, UpstreamHTTPError):
        return exc.response.status, Outcome.FAILED, str(exc.response.status)
    if isinstance(exc, GatewayError):
        return exc.status, Outcome.FAILED, exc.error_kind
    if isinstance(exc, asyncio.CancelledError | ConnectionResetError):
        return CLIENT_CLOSED_REQUEST, Outcome.CANCELLED, "cancelled"
    return 500, Outcome.FAILED, "internal_error"
