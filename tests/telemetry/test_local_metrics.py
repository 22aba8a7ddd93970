"""The gateway's own instruments export what the SDK's would for the same measurements."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from llmgw.telemetry.local_metrics import CARDINALITY_LIMIT, AttributeSet, LocalMeter

BOUNDARIES = (0.0, 0.01, 0.1, 1.0, 10.0)
SCOPE = InstrumentationScope("llmgw", "1")
DELTA = {Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA}

values = st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.sampled_from(BOUNDARIES)
attribute_sets = st.sampled_from(
    [{}, {"gen_ai.request.model": "a"}, {"gen_ai.request.model": "b", "server.port": 443}]
)


# How a LocalMeter reaches the reader: the private-name fast path, or the SDK's instruments.
PATHS = pytest.mark.parametrize("hooked", [True, False], ids=["reader-hook", "public-api"])
# How the attributes are given: a mapping, or an AttributeSet made of it (made once, recorded often).
GIVEN = pytest.mark.parametrize("given_as", [dict, AttributeSet], ids=["mapping", "attribute-set"])


class Pair:
    """The SDK and a LocalMeter, each with its own reader, fed the same measurements."""

    def __init__(self, *, hooked: bool = True, **reader: Any) -> None:
        self.resource = Resource.create({"service.name": "test"})
        self.sdk_reader = InMemoryMetricReader(**reader)
        self.local_reader = InMemoryMetricReader(**reader)
        sdk = MeterProvider(
            resource=self.resource,
            metric_readers=[self.sdk_reader],
            exemplar_filter=AlwaysOffExemplarFilter(),
        )
        local = MeterProvider(resource=self.resource, metric_readers=[self.local_reader])
        self.local = LocalMeter(self.resource, SCOPE)
        if hooked:
            self.local.attach(self.local_reader)
        else:
            self.local.record_through(local.get_meter(SCOPE.name, SCOPE.version))
        meter = sdk.get_meter(SCOPE.name, SCOPE.version)
        self.sdk_histogram = meter.create_histogram(
            "h", unit="s", explicit_bucket_boundaries_advisory=list(BOUNDARIES)
        )
        self.sdk_counter = meter.create_counter("c", unit="{x}")
        self.histogram = self.local.create_histogram("h", unit="s", boundaries=BOUNDARIES)
        self.counter = self.local.create_counter("c", unit="{x}")

    def points(self) -> tuple[dict[Any, Any], dict[Any, Any]]:
        return _points(self.sdk_reader), _points(self.local_reader)


def _points(reader: InMemoryMetricReader) -> dict[Any, Any]:
    """(metric, attributes) -> the point's exported figures, times left out."""
    found: dict[Any, Any] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (
                        scope.scope.name,
                        metric.name,
                        metric.unit,
                        frozenset(point.attributes.items()),
                    )
                    if hasattr(point, "bucket_counts"):
                        found[key] = (
                            metric.data.aggregation_temporality,
                            point.count,
                            point.sum,
                            tuple(point.bucket_counts),
                            tuple(point.explicit_bounds),
                            point.min,
                            point.max,
                        )
                    else:
                        found[key] = (
                            metric.data.aggregation_temporality,
                            metric.data.is_monotonic,
                            point.value,
                        )
    return found


def _close(sdk: dict[Any, Any], local: dict[Any, Any]) -> None:
    assert sdk.keys() == local.keys()
    for key, expected in sdk.items():
        for ours, theirs in zip(local[key], expected, strict=True):
            if isinstance(theirs, float):
                assert math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=1e-9), key
            else:
                assert ours == theirs, key


@PATHS
@GIVEN
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(values, attribute_sets), max_size=40))
def test_histogram_and_counter_export_as_the_sdk_would(
    hooked: bool, given_as: Any, measurements: list[tuple[float, dict[str, Any]]]
) -> None:
    pair = Pair(hooked=hooked)
    for value, attributes in measurements:
        pair.sdk_histogram.record(value, attributes)
        pair.histogram.record(value, given_as(attributes))
        pair.sdk_counter.add(value, attributes)
        pair.counter.add(value, given_as(attributes))
    _close(*pair.points())


@PATHS
@GIVEN
@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(values, max_size=25), max_size=5), attribute_sets)
def test_a_run_of_gaps_adds_up_to_its_points(
    hooked: bool, given_as: Any, runs: list[list[float]], attributes: Any
) -> None:
    pair = Pair(hooked=hooked)
    for run in runs:
        gaps = pair.histogram.gaps()
        for value in run:
            pair.sdk_histogram.record(value, attributes)
            gaps.add(value)
        pair.histogram.add_all(gaps, given_as(attributes))
    _close(*pair.points())


@PATHS
def test_a_delta_reader_gets_each_measurement_once(hooked: bool) -> None:
    pair = Pair(hooked=hooked, preferred_temporality=DELTA)
    for batch in ([0.5, 2.0], [], [20.0]):
        for value in batch:
            for instrument in (pair.sdk_histogram, pair.histogram):
                instrument.record(value, {"k": "v"})
            for counter in (pair.sdk_counter, pair.counter):
                counter.add(1, {"k": "v"})
        sdk, local = pair.points()
        _close(sdk, local)
        assert bool(local) == bool(batch)


@PATHS
def test_local_metrics_join_the_sdk_meters_scope(hooked: bool) -> None:
    resource = Resource.create({"service.name": "test"})
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    meter = provider.get_meter(SCOPE.name, SCOPE.version)
    meter.create_counter("sdk.counter").add(1)
    local = LocalMeter(resource, SCOPE)
    counter = local.create_counter("local.counter")  # made before the meter met its reader
    if hooked:
        local.attach(reader)
    else:
        local.record_through(meter)
    counter.add(2)
    data = reader.get_metrics_data()
    assert data is not None
    [resource_metrics] = data.resource_metrics
    [scope_metrics] = resource_metrics.scope_metrics
    assert {metric.name for metric in scope_metrics.metrics} == {"sdk.counter", "local.counter"}


@PATHS
def test_attribute_sets_past_the_limit_share_the_overflow_point(hooked: bool) -> None:
    pair = Pair(hooked=hooked)
    for index in range(CARDINALITY_LIMIT + 5):
        pair.histogram.record(1.0, {"n": index})
        pair.sdk_histogram.record(1.0, {"n": index})
    sdk, local = pair.points()
    if not hooked:
        # Through the SDK's own instruments the limit is the installed SDK's (before 1.44 it
        # has none by default): the points are exactly the SDK's.
        assert local == sdk
        return
    assert len(local) == CARDINALITY_LIMIT + 1
    overflow = local[("llmgw", "h", "s", frozenset({("otel.metric.overflow", True)}))]
    assert overflow[1] == 5
