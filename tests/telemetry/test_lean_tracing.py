"""Lean spans reach the SDK's processors as the SDK's own spans would, for the same calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceState

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.telemetry.lean_tracing import LeanTracer, tracer_for

scalars = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
values = st.one_of(
    scalars,
    st.lists(st.text(max_size=5), max_size=3),
    st.lists(st.integers(min_value=0, max_value=9), max_size=3).map(tuple),
    st.lists(st.booleans(), max_size=3),
    st.none(),
    st.just({"a": 1}),  # not an attribute value: dropped by both
    st.just([1, "mixed"]),  # neither
)
keys = st.sampled_from(["gen_ai.request.model", "server.port", "k1", "k2", "k3", "error.type"])
attributes = st.dictionaries(keys, values, max_size=4)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values),
        st.tuples(st.just("set_many"), attributes),
        st.tuples(st.just("status"), st.sampled_from(list(StatusCode)), st.text(max_size=5)),
        st.tuples(st.just("event"), st.text(max_size=5), attributes),
        st.tuples(st.just("rename"), st.text(max_size=5)),
        st.tuples(st.just("exception")),
    ),
    max_size=8,
)


class Twin:
    """An SDK tracer and a lean one, on two providers built the same way."""

    def __init__(self, **provider: Any) -> None:
        self.sdk_spans = InMemorySpanExporter()
        self.lean_spans = InMemorySpanExporter()
        resource = Resource.create({"service.name": "test"})
        sdk_provider = TracerProvider(resource=resource, **provider)
        sdk_provider.add_span_processor(SimpleSpanProcessor(self.sdk_spans))
        lean_provider = TracerProvider(resource=resource, **provider)
        lean_provider.add_span_processor(SimpleSpanProcessor(self.lean_spans))
        self.sdk = sdk_provider.get_tracer("llmgw", "1")
        # The lean tracer itself, whether or not tracer_for would choose it here.
        sdk_tracer = lean_provider.get_tracer("llmgw", "1")
        assert isinstance(sdk_tracer, SdkTracer)
        self.lean = LeanTracer(sdk_tracer, InstrumentationScope("llmgw", "1"))

    def both(self, run: Callable[[trace.Tracer], None]) -> None:
        run(self.sdk)
        run(self.lean)

    def compare(self) -> None:
        sdk = self.sdk_spans.get_finished_spans()
        lean = self.lean_spans.get_finished_spans()
        assert len(lean) == len(sdk)
        for ours, theirs in zip(lean, sdk, strict=True):
            expected = _fields(theirs)
            assert _fields(ours) == expected, {
                k: v for k, v in _fields(ours).items() if v != expected[k]
            }


def _fields(span: ReadableSpan) -> dict[str, Any]:
    """Everything an exporter reads of a span, ids and times as facts about them."""
    assert span.context is not None
    return {
        "name": span.name,
        "kind": span.kind,
        "trace_flags": span.context.trace_flags,
        "is_remote": span.context.is_remote,
        # A local parent's id is random (checked where it matters); a remote one is the caller's.
        "parent": None
        if span.parent is None
        else (span.parent.span_id if span.parent.is_remote else "local", span.parent.is_remote),
        "attributes": dict(span.attributes or {}),
        "dropped_attributes": span.dropped_attributes,
        "events": [
            (event.name, {k: v for k, v in (event.attributes or {}).items() if "stack" not in k})
            for event in span.events
        ],
        "dropped_events": span.dropped_events,
        "links": [(link.context, dict(link.attributes or {})) for link in span.links],
        "status": (span.status.status_code, span.status.description),
        "resource": span.resource.attributes,
        "scope": span.instrumentation_scope,
        "timed": span.start_time is not None and span.end_time is not None,
    }


def _apply(span: trace.Span, steps: list[tuple[Any, ...]]) -> None:
    for step in steps:
        match step:
            case ("set", key, value):
                span.set_attribute(key, value)
            case ("set_many", many):
                span.set_attributes(many)
            case ("status", code, description):
                span.set_status(Status(code, description or None))
            case ("event", name, many):
                span.add_event(name, many, timestamp=1)
            case ("rename", name):
                span.update_name(name)
            case ("exception",):
                span.record_exception(ValueError("boom"), timestamp=2)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=10), st.sampled_from(list(SpanKind)), attributes, operations)
def test_spans_match_the_sdks_for_the_same_calls(
    name: str, kind: SpanKind, initial: dict[str, Any], steps: list[tuple[Any, ...]]
) -> None:
    twin = Twin()

    def run(tracer: trace.Tracer) -> None:
        span = tracer.start_span(name, kind=kind, attributes=initial)
        _apply(span, steps)
        span.end()
        span.set_attribute("after", "end")  # ignored once ended
        span.end()  # a second end changes nothing

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("opentelemetry.attributes._logger.warning", lambda *a, **k: None)
        twin.both(run)
    twin.compare()


@pytest.mark.parametrize(
    "sampler",
    [None, ParentBased(ALWAYS_ON), ParentBased(ALWAYS_OFF)],
    ids=["default", "parent-based", "parent-based-off"],
)
def test_children_and_remote_parents_are_linked_as_in_the_sdk(sampler: Sampler | None) -> None:
    twin = Twin(**({} if sampler is None else {"sampler": sampler}))
    state = TraceState([("vendor", "value")])
    sampled = SpanContext(0x1234, 0x5678, True, trace.TraceFlags(1), trace_state=state)
    unsampled = SpanContext(0x4321, 0x8765, is_remote=True, trace_flags=trace.TraceFlags(0))

    def run(tracer: trace.Tracer) -> None:
        for remote in (sampled, unsampled):
            parent_context = trace.set_span_in_context(NonRecordingSpan(remote))
            server = tracer.start_span("server", context=parent_context, kind=SpanKind.SERVER)
            assert server.get_span_context().trace_state == remote.trace_state
            token = context.attach(trace.set_span_in_context(server))
            try:
                client = tracer.start_span("client", kind=SpanKind.CLIENT)
                assert client.get_span_context().trace_id == remote.trace_id
                client.end()
            finally:
                context.detach(token)
            server.end()

    twin.both(run)
    twin.compare()
    finished = twin.lean_spans.get_finished_spans()
    assert all(span.context is not None and span.context.trace_id == 0x1234 for span in finished)
    if len(finished) == 2:
        [client, server] = finished
        assert client.parent is not None
        assert server.context is not None
        assert client.parent.span_id == server.context.span_id


def test_the_count_and_length_limits_apply_as_in_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    twin = Twin()

    def run(tracer: trace.Tracer) -> None:
        span = tracer.start_span("s", attributes={"a": "long value", "b": ["abcdef", "x"]})
        span.set_attributes({"c": 1, "d": 2.5, "a": "again"})
        span.end()

    twin.both(run)
    twin.compare()
    [span] = twin.lean_spans.get_finished_spans()
    assert dict(span.attributes or {}) == {"c": 1, "d": 2.5, "a": "agai"}
    assert span.dropped_attributes == 2


def test_the_count_limit_applies_as_in_the_sdk_to_attributes_set_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    twin = Twin()

    def run(tracer: trace.Tracer) -> None:
        span = tracer.start_span("s", attributes={"a": 1, "b": 2.5})
        span.set_attributes({"c": True, "a": 4, "d": "x", "e": 5, "f": ["y"], "g": 6})
        span.end()

    twin.both(run)
    twin.compare()
    [span] = twin.lean_spans.get_finished_spans()
    assert dict(span.attributes or {}) == {"e": 5, "f": ("y",), "g": 6}


def test_an_unsampled_span_records_nothing() -> None:
    twin = Twin(sampler=ALWAYS_OFF)

    def run(tracer: trace.Tracer) -> None:
        span = tracer.start_span("dropped", attributes={"a": 1})
        assert not span.is_recording()
        span.end()

    twin.both(run)
    assert twin.lean_spans.get_finished_spans() == ()
    twin.compare()


def test_start_as_current_span_records_what_escapes_it() -> None:
    twin = Twin()

    def run(tracer: trace.Tracer) -> None:
        with pytest.raises(KeyError), tracer.start_as_current_span("failing") as span:
            assert trace.get_current_span() is span
            raise KeyError("missing")

    twin.both(run)
    twin.compare()
    [span] = twin.lean_spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]


def test_links_are_kept_as_in_the_sdk() -> None:
    twin = Twin()
    valid = SpanContext(0x1, 0x2, is_remote=True)
    invalid = SpanContext(0, 0, is_remote=False)

    def run(tracer: trace.Tracer) -> None:
        links = [Link(valid, {"a": 1}), Link(invalid, {"kept": True}), Link(invalid)]
        span = tracer.start_span("linked", links=links)
        span.add_link(valid, {"b": "later"})
        span.add_link(invalid)
        span.end()

    twin.both(run)
    twin.compare()
    [span] = twin.lean_spans.get_finished_spans()
    assert len(span.links) == 3


@pytest.mark.parametrize("public_apis_only", [False, True], ids=["lean-tracer", "public-api"])
def test_the_lean_tracer_only_where_verified(
    monkeypatch: pytest.MonkeyPatch, public_apis_only: bool
) -> None:
    monkeypatch.setenv(PUBLIC_APIS_ONLY_VARIABLE, str(public_apis_only).lower())
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_for(provider, "llmgw", "1")
    assert isinstance(tracer, LeanTracer) is not public_apis_only
    with tracer.start_as_current_span("request", attributes={"k": "v"}):
        pass
    [span] = exporter.get_finished_spans()
    assert span.attributes == {"k": "v"}


def test_a_disabled_sdk_gets_its_own_no_op_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    tracer = tracer_for(TracerProvider(), "llmgw", "1")
    assert not isinstance(tracer, LeanTracer)
    assert not tracer.start_span("nothing").is_recording()
