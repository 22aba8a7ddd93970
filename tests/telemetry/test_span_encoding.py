"""Our OTLP span encoder writes what the official one does, and its exporter sends it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.compat import opentelemetry_exporter_otlp as span_export
from llmgw.compat.opentelemetry_exporter_otlp import FastOTLPSpanExporter
from llmgw.telemetry import span_encoding
from llmgw.telemetry.lean_tracing import LeanTracer
from llmgw.telemetry.span_encoding import SpanEncoder
from tests.otlp_receiver import OtlpReceiver

# One encoder for every example too, so memos filled by one batch are read by the next.
SHARED_ENCODER = SpanEncoder()

INT64 = st.integers(-(2**63), 2**63 - 1)
SCALARS: list[st.SearchStrategy[Any]] = [
    st.text(max_size=12),
    st.booleans(),
    INT64 | st.sampled_from([-(2**63), 2**63 - 1, 0, -1]),
    st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, float("inf"), float("-inf")]),
    st.binary(max_size=8),
]
VALUES = st.one_of(
    *SCALARS,
    *(st.lists(scalar, max_size=3) for scalar in SCALARS),  # homogeneous arrays
    st.lists(st.one_of(*SCALARS, st.none()), max_size=3),  # the SDK takes mixed ones and None
    st.dictionaries(st.text(min_size=1, max_size=4), st.one_of(*SCALARS), max_size=2),
    st.integers(2**63, 2**64),  # out of int64: both encoders log it and leave it out
)
KEYS = st.sampled_from(["gen_ai.request.model", "server.port", "k"]) | st.text(max_size=8)
ATTRIBUTES = st.dictionaries(KEYS, VALUES, max_size=5)
# A pool, so batches hold equal resources that are distinct objects, which the official encoder
# merges into one ResourceSpans.
RESOURCE_ATTRIBUTES = st.sampled_from([{"service.name": "llmgw"}, {"service.name": "other"}, {}])
TRACE_STATES = st.sampled_from([TraceState(), TraceState([("vendor", "v1"), ("other", "x")])])
TIMES = st.none() | st.integers(0, 2**64 - 1)
# Small enough that spans drop attributes, events and links, and count what they dropped.
TIGHT_LIMITS = SpanLimits(
    max_attributes=2, max_events=1, max_links=1, max_event_attributes=1, max_link_attributes=1
)


def span_contexts(*, is_remote: st.SearchStrategy[bool]) -> st.SearchStrategy[SpanContext]:
    return st.builds(
        SpanContext,
        trace_id=st.integers(1, 2**128 - 1),
        span_id=st.integers(1, 2**64 - 1),
        is_remote=is_remote,
        trace_flags=st.sampled_from([TraceFlags(0), TraceFlags(TraceFlags.SAMPLED)]),
        trace_state=TRACE_STATES,
    )


class DrawnIds(IdGenerator):
    """Ids from a Random Hypothesis draws, instead of the random module it warns about."""

    def __init__(self, ids: random.Random) -> None:
        self._ids = ids

    def generate_span_id(self) -> int:
        return self._ids.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._ids.getrandbits(128) or 1


@st.composite
def batches(draw: st.DrawFn) -> Sequence[ReadableSpan]:
    """Finished spans (the SDK's and lean ones) from up to three providers and several tracers
    each, interleaved."""
    collected = InMemorySpanExporter()
    ids = DrawnIds(draw(st.randoms()))
    tracers = []
    for _ in range(draw(st.integers(1, 3))):
        resource = Resource(draw(RESOURCE_ATTRIBUTES), draw(st.sampled_from(["", "https://s/1"])))
        limits = draw(st.sampled_from([SpanLimits(), TIGHT_LIMITS]))
        provider = TracerProvider(
            resource=resource,
            span_limits=limits,
            sampler=ALWAYS_ON,
            id_generator=ids,
            shutdown_on_exit=False,
        )
        provider.add_span_processor(SimpleSpanProcessor(collected))
        for _ in range(draw(st.integers(1, 2))):
            name = draw(st.sampled_from(["llmgw", "", "other"]))
            version = draw(st.sampled_from([None, "", "0.1.0"]))
            schema = draw(st.sampled_from([None, "https://s/2"]))
            scope_attributes = draw(st.none() | ATTRIBUTES)
            if draw(st.booleans()):  # the gateway's own spans too
                scope = InstrumentationScope(name, version, schema, scope_attributes)
                sdk_tracer = provider.get_tracer(name, version, schema, scope_attributes)
                assert isinstance(sdk_tracer, Tracer)
                tracers.append(LeanTracer(sdk_tracer, scope))
            else:
                tracers.append(provider.get_tracer(name, version, schema, scope_attributes))
    for _ in range(draw(st.integers(1, 4))):
        tracer = draw(st.sampled_from(tracers))
        parent = draw(st.sampled_from(["root", "local", "remote"]))
        context = None
        if parent == "remote":
            remote = draw(span_contexts(is_remote=st.just(True)))
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        links = [
            Link(link_context, draw(st.none() | ATTRIBUTES))
            for link_context in draw(st.lists(span_contexts(is_remote=st.booleans()), max_size=2))
        ]
        outer = tracer.start_span("outer", context=context) if parent == "local" else None
        if outer is not None:
            context = trace.set_span_in_context(outer)
        span = tracer.start_span(
            draw(st.text(max_size=12)),
            context=context,
            kind=draw(st.sampled_from(SpanKind)),
            attributes=draw(ATTRIBUTES),
            links=links,
            start_time=draw(TIMES),
        )
        for _ in range(draw(st.integers(0, 2))):
            span.add_event(draw(st.text(max_size=6)), draw(ATTRIBUTES), draw(TIMES))
        span.set_status(Status(draw(st.sampled_from(StatusCode)), draw(st.none() | st.text())))
        span.end(draw(TIMES))
        if outer is not None:
            outer.end()
    return draw(st.permutations(collected.get_finished_spans()))


def assert_encodes_as_official(encoder: SpanEncoder, spans: Sequence[ReadableSpan]) -> None:
    ours = encoder.encode_spans(spans)
    official = encode_spans(spans)
    assert ExportTraceServiceRequest.FromString(ours) == official
    # Fields go in field-number order, as protobuf writes them, so the bytes match too: stricter
    # than == (which takes -0.0 for 0.0).
    assert ours == official.SerializePartialToString()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=batches())
def test_spans_encode_to_the_official_encoders_message(spans: Sequence[ReadableSpan]) -> None:
    for encoder in (SpanEncoder(), SHARED_ENCODER):
        assert_encodes_as_official(encoder, spans)


def finished_spans(*attribute_sets: dict[str, Any]) -> Sequence[ReadableSpan]:
    collected = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("test")
    for attributes in attribute_sets:
        tracer.start_span("chat", attributes=attributes).end()
    return collected.get_finished_spans()


def test_equal_values_of_other_types_are_not_taken_from_the_memo() -> None:
    # True == 1 == 1.0, and (True,) == (1,), with equal hashes: a memo keyed on the value alone
    # would answer one with another's bytes.
    values = [True, 1, 1.0, ("a",), (True,), (1,), (1.0,), "1", 1, True]
    encoder = SpanEncoder()
    for value in values:
        assert_encodes_as_official(encoder, finished_spans({"k": value}))
    assert_encodes_as_official(encoder, finished_spans(*({"k": value} for value in values)))


def test_the_memo_stays_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_encoding, "MAX_CACHED_ATTRIBUTES", 8)
    encoder = SpanEncoder()
    for batch in range(5):
        spans = finished_spans(
            *(
                {f"key.{n}": f"value {batch}.{n}", "n": batch * 10 + n, f"f.{n}": 0.5}
                for n in range(10)
            )
        )
        assert_encodes_as_official(encoder, spans)
        assert len(encoder._attributes) <= 8
        assert len(encoder._float_keys) <= 8
    # Nor do long values go in: they rarely repeat, and a captured prompt is large.
    encoder = SpanEncoder()
    assert_encodes_as_official(encoder, finished_spans({"prompt": "x" * 1000}))
    assert "prompt" not in {key for key, _, _ in encoder._attributes}


def test_repeated_attributes_are_served_from_the_memo() -> None:
    encoder = SpanEncoder()
    attributes = {"gen_ai.provider.name": "venice", "server.port": 443, "stream": True}
    assert_encodes_as_official(encoder, finished_spans(attributes))
    remembered = dict(encoder._attributes)
    assert {("server.port", 443, int), ("stream", True, bool)} <= remembered.keys()
    for _ in range(3):
        assert_encodes_as_official(encoder, finished_spans(attributes, attributes))
    assert encoder._attributes == remembered


@pytest.mark.skipif(
    not span_export.OTLP_SPAN_EXPORT.enabled(),
    reason="not verified on this exporter version, or public APIs only: the official one runs",
)
async def test_the_exporter_posts_our_encoding_to_a_collector(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def official_encoder(spans: Sequence[ReadableSpan]) -> Any:
        raise AssertionError("the official encoder was used")

    monkeypatch.setattr(trace_exporter, "encode_spans", official_encoder)
    exporter = FastOTLPSpanExporter(
        endpoint=f"{receiver.endpoint}/v1/traces", encode_spans=SpanEncoder().encode_spans
    )
    spans = finished_spans({"gen_ai.request.model": "qwen3-5-9b", "server.port": 443})
    try:
        result = await asyncio.to_thread(exporter.export, spans)
    finally:
        exporter.shutdown()
    assert result is SpanExportResult.SUCCESS
    assert receiver.span_attributes("chat") == [
        {"gen_ai.request.model": "qwen3-5-9b", "server.port": 443}
    ]
    assert receiver.spans[0].span_id == spans[0].context.span_id.to_bytes(8, "big")


async def test_with_the_fast_path_off_the_official_export_runs(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on an exporter version the fast path was not verified on.
    monkeypatch.setenv(PUBLIC_APIS_ONLY_VARIABLE, "true")
    used: list[int] = []

    def official_encoder(spans: Sequence[ReadableSpan]) -> Any:
        used.append(len(spans))
        return encode_spans(spans)

    monkeypatch.setattr(trace_exporter, "encode_spans", official_encoder)
    exporter = FastOTLPSpanExporter(
        endpoint=f"{receiver.endpoint}/v1/traces", encode_spans=SpanEncoder().encode_spans
    )
    try:
        result = await asyncio.to_thread(exporter.export, finished_spans({"k": "v"}))
    finally:
        exporter.shutdown()
    assert result is SpanExportResult.SUCCESS
    assert used == [1]
    assert receiver.span_attributes("chat") == [{"k": "v"}]
