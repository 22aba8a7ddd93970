"""A tracer for the SDK's own pipeline whose spans keep their attributes in a plain dict.

Why: the SDK's ``Span`` guards every attribute with a lock and a ``BoundedAttributes`` that checks
each value's type recursively; for the gateway's two spans per request (about 30 attributes) that
is ~550 Python calls, a third of the gateway's own work. These spans take a primitive value as it
is and leave anything else to the SDK's own cleaning; they are sampled by the provider's sampler, get their ids from
its id generator, and reach its span processors (and so its exporters) as the SDK's
``ReadableSpan``, with the same name, kind, context, parent, attributes, events, links, status,
times, resource and instrumentation scope. The attribute limits are the SDK's (``SpanLimits``,
which reads the ``OTEL_*_LIMIT`` variables), applied the SDK's way: past the count limit the
oldest attribute is dropped and counted, strings are cut at the length limit.

Spans are meant for one thread at a time (the event loop's); only their ending hands them over.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision, Sampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import Attributes, AttributeValue

from llmgw.compat.opentelemetry_sdk import LEAN_TRACER

__all__ = ["LeanTracer", "tracer_for"]

log = logging.getLogger(__name__)

# Kept as they are. A None goes through the SDK's cleaning: 1.43 drops it, later releases keep it
# (llmgw's own attributes are never None, so this costs the hot path nothing).
_KEPT = (bool, int, float)


def tracer_for(provider: trace_api.TracerProvider, name: str, version: str) -> trace_api.Tracer:
    """A lean tracer over an SDK provider's pipeline; any other tracer as the provider gives it
    (a no-op provider's, the SDK's own when it is disabled with OTEL_SDK_DISABLED, or on an SDK
    version the lean tracer was not verified against: it reproduces that version's spans)."""
    tracer = provider.get_tracer(name, version)
    if isinstance(tracer, SdkTracer) and LEAN_TRACER.enabled():
        return LeanTracer(tracer, InstrumentationScope(name, version))
    return tracer


class _FinishedSpan(ReadableSpan):
    """What the processors get: a ReadableSpan that knows how many attributes were dropped."""

    def __init__(self, dropped_attributes: int, **fields: Any) -> None:
        super().__init__(**fields)
        self._dropped_attributes = dropped_attributes

    @property
    def dropped_attributes(self) -> int:
        return self._dropped_attributes


class _LeanSpan(trace_api.Span):
    __slots__ = (
        "_attributes",
        "_context",
        "_dropped",
        "_end_time",
        "_events",
        "_kind",
        "_links",
        "_name",
        "_parent",
        "_record_exception",
        "_set_status_on_exception",
        "_start_time",
        "_status",
        "_tracer",
    )

    def __init__(
        self,
        tracer: LeanTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        attributes: Attributes,
        links: Sequence[Link],
        start_time: int | None,
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._attributes: dict[str, AttributeValue] = {}
        self._dropped = 0
        # Made when the first one comes: most spans have neither.
        self._events: BoundedList[Event] | None = None
        self._links: BoundedList[Link] | None = None
        self._status = Status(StatusCode.UNSET)
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception
        self._start_time = start_time if start_time is not None else time.time_ns()
        self._end_time: int | None = None
        for link in links:
            self.add_link(link.context, link.attributes)
        if attributes:
            self.set_attributes(attributes)

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._end_time is not None:
            log.warning("Setting attribute on ended span.")
            return
        own = self._attributes
        limits = self._tracer.limits
        most, length = limits.max_span_attributes, limits.max_span_attribute_length
        # How many more fit: counted down as they go in, not a len() per attribute.
        room = math.inf if most is None else most - len(own)
        for key, value in attributes.items():
            kind = type(value)
            # The usual attribute, inline: a new key with a value kept as it is, and room for it.
            if (
                (kind is int or kind is float or kind is bool or (kind is str and length is None))
                and type(key) is str
                and key
                and key not in own
                and room > 0
            ):
                own[key] = value
                room -= 1
            else:
                self._set(key, value)
                room = math.inf if most is None else most - len(own)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self._end_time is not None:
            log.warning("Setting attribute on ended span.")
            return
        self._set(key, value)

    def _set(self, key: str, value: Any) -> None:
        limits = self._tracer.limits
        if not key or type(key) is not str:
            log.warning("invalid key `%s`. must be non-empty string. Dropping key.", key)
            self._dropped += 1
            return
        kind = type(value)
        if kind is str:
            length = limits.max_span_attribute_length
            if length is not None:
                value = value[:length]
        elif (kind is list or kind is tuple) and all(type(item) is str for item in value):
            length = limits.max_span_attribute_length  # finish reasons, stop sequences
            value = tuple(value) if length is None else tuple(item[:length] for item in value)
        elif kind not in _KEPT:
            # Anything else (sequences, mappings, bytes, other objects) as the SDK would keep it.
            cleaned = BoundedAttributes(
                None, {key: value}, immutable=True, max_value_len=limits.max_span_attribute_length
            )
            if key not in cleaned:
                return
            value = cleaned[key]
        attributes = self._attributes
        if key in attributes:
            del attributes[key]  # as the SDK: a value set again moves to the end
        elif len(attributes) == limits.max_span_attributes:
            del attributes[next(iter(attributes))]
            self._dropped += 1
        attributes[key] = value

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        if self._end_time is not None:
            return
        limits = self._tracer.limits
        if self._events is None:
            self._events = BoundedList(limits.max_events)
        bounded = BoundedAttributes(
            limits.max_event_attributes,
            attributes,
            max_value_len=limits.max_attribute_length,
            immutable=True,
        )
        self._events.append(Event(name=name, attributes=bounded, timestamp=timestamp))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        # As the SDK: a link to an invalid context still counts when it carries something.
        valid = context and (context.is_valid or attributes or context.trace_state)
        if self._end_time is not None or not valid:
            return
        if self._links is None:
            self._links = BoundedList(self._tracer.limits.max_links)
        self._links.append(self._tracer.bounded_link(Link(context, attributes)))

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # As the SDK: an OK status is final, and UNSET never replaces another.
        if self._end_time is not None or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        recorded: dict[str, AttributeValue] = {
            "exception.type": f"{module}.{qualname}"
            if module and module != "builtins"
            else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            log.warning("Calling end() on an ended span.")
            return
        self._end_time = end_time if end_time is not None else time.time_ns()
        tracer = self._tracer
        tracer.processor.on_end(
            _FinishedSpan(
                self._dropped,
                name=self._name,
                context=self._context,
                parent=self._parent,
                resource=tracer.resource,
                attributes=self._attributes,
                events=() if self._events is None else self._events,
                links=() if self._links is None else self._links,
                kind=self._kind,
                status=self._status,
                start_time=self._start_time,
                end_time=self._end_time,
                instrumentation_scope=tracer.scope,
            )
        )

    def __exit__(self, exc_type: Any, exc_val: BaseException | None, exc_tb: Any) -> None:
        if exc_val is not None and self.is_recording():
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        self.end()


class LeanTracer(trace_api.Tracer):
    """Starts spans as an SDK tracer would: its provider's sampler, ids, resource and processors,
    for ``scope``."""

    def __init__(self, sdk_tracer: SdkTracer, scope: InstrumentationScope) -> None:
        self.sampler: Sampler = sdk_tracer.sampler
        self.id_generator: IdGenerator = sdk_tracer.id_generator
        self.resource: Resource = sdk_tracer.resource
        self.processor: SpanProcessor = sdk_tracer.span_processor
        self.scope = scope
        # The limits an SDK TracerProvider built without span_limits uses (from the environment).
        self.limits = SpanLimits()

    def bounded_link(self, link: Link) -> Link:
        limits = self.limits
        attributes = BoundedAttributes(
            limits.max_link_attributes,
            link.attributes,
            max_value_len=limits.max_attribute_length,
            immutable=True,
        )
        return Link(link.context, attributes)

    def start_span(
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        links = links or ()
        parent: SpanContext | None = trace_api.get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
            trace_id = self.id_generator.generate_trace_id()
            random_trace_id = self.id_generator.is_trace_id_random()
        else:
            trace_id = parent.trace_id
            random_trace_id = parent.trace_flags.random_trace_id
        if self.sampler is DEFAULT_ON:
            # The SDK's default, decided here as it decides: sampled when the parent is (or there is
            # none), with the parent's trace state.
            decision = (
                Decision.RECORD_AND_SAMPLE
                if parent is None or parent.trace_flags.sampled
                else Decision.DROP
            )
            trace_state = None if parent is None else parent.trace_state
        else:
            sampled = self.sampler.should_sample(context, trace_id, name, kind, attributes, links)
            decision, trace_state, attributes = (
                sampled.decision,
                sampled.trace_state,
                sampled.attributes,
            )
        flags = TraceFlags.SAMPLED if decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        if random_trace_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        span_context = SpanContext(
            trace_id,
            self.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=trace_state,
        )
        if decision is Decision.DROP:
            return trace_api.NonRecordingSpan(span_context)
        span = _LeanSpan(
            self,
            name,
            span_context,
            parent,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        self.processor.on_start(span, parent_context=context)  # type: ignore[arg-type]
        return span

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: context_api.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        span = self.start_span(
            name, context, kind, attributes, links, start_time, record_exception,
            set_status_on_exception,
        )  # fmt: skip
        with trace_api.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current
