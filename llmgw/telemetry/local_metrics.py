"""The gateway's own histograms and counters: aggregated where they are recorded, exported by the
SDK's readers as if the SDK had aggregated them.

Why: the SDK's ``Histogram.record`` costs about 9 µs of CPU per point (it cleans and hashes every
attribute of every measurement and walks three layers of dispatch), and a streamed answer records
a point per chunk. Here a point costs about 1 µs: the attribute set is hashed once, the bucket
found with ``bisect``, and a stream's chunk gaps are summed where they happen and added to the
histogram in one step when it ends (:meth:`LocalHistogram.add_all`), which gives the same bucket
counts, sum, count, min and max as one point per gap.

What the readers export is what the SDK would: explicit-bucket histograms and monotonic sums with
the same names, units, attributes and bucket boundaries, cumulative or delta as each reader
prefers, from the meter's own instrumentation scope. Each reader keeps its own accumulation (a
delta reader's starts afresh at every collection); :meth:`LocalMeter.attach` joins a reader's
collection through ``compat.opentelemetry_sdk``'s private-name fast path. Where that fast path is
off (an SDK version it was not verified on, or ``LLMGW_PUBLIC_APIS_ONLY``),
:meth:`LocalMeter.record_through` sends every point to the SDK's own instruments instead: the
same metrics, at the SDK's cost.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from opentelemetry import metrics
from opentelemetry.sdk.metrics import Counter as SdkCounter
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from llmgw.compat.opentelemetry_sdk import join_collection, wants_delta

__all__ = ["AttributeSet", "GapHistogram", "LocalCounter", "LocalHistogram", "LocalMeter"]

AttributeValue = str | int | float | bool
Attributes = Mapping[str, AttributeValue]

# As the SDK: past this many attribute sets per instrument, new ones share one overflow point.
CARDINALITY_LIMIT = 2000
_OVERFLOW_ATTRIBUTES: dict[str, AttributeValue] = {"otel.metric.overflow": True}
_OVERFLOW_KEY = frozenset(_OVERFLOW_ATTRIBUTES.items())


class AttributeSet:
    """An attribute set recorded again and again (every request to a model names the same):
    copied, and hashed into its points' key, once instead of at every point."""

    __slots__ = ("attributes", "key")

    def __init__(self, attributes: Attributes) -> None:
        self.attributes: dict[str, AttributeValue] = dict(attributes)
        self.key = frozenset(self.attributes.items())


AnyAttributes = Attributes | AttributeSet


def _mapping(attributes: AnyAttributes | None) -> Attributes | None:
    return attributes.attributes if isinstance(attributes, AttributeSet) else attributes


class GapHistogram:
    """Bucket counts, sum, count, min and max of a run of values, before it joins a histogram."""

    __slots__ = ("boundaries", "count", "counts", "maximum", "minimum", "total", "values")

    def __init__(self, boundaries: Sequence[float], *, keep_values: bool = False) -> None:
        self.boundaries = boundaries
        # Kept only where the SDK aggregates (LocalMeter.record_through): it takes single values.
        self.values: list[float] | None = [] if keep_values else None
        self.counts = [0] * (len(boundaries) + 1)
        self.count = 0
        self.total = 0.0
        self.minimum = float("inf")
        self.maximum = float("-inf")

    def add(self, value: float) -> None:
        # bisect_left: a value equal to a boundary belongs to the bucket that boundary closes.
        self.counts[bisect.bisect_left(self.boundaries, value)] += 1
        self.count += 1
        self.total += value
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value
        if self.values is not None:
            self.values.append(value)


class _Point:
    __slots__ = ("attributes", "count", "counts", "maximum", "minimum", "started", "total")

    def __init__(self, attributes: dict[str, AttributeValue], buckets: int, started: int) -> None:
        self.attributes = attributes
        self.started = started
        self.counts = [0] * buckets
        self.count = 0
        self.total: float = 0
        self.minimum = float("inf")
        self.maximum = float("-inf")


@attrs.define(eq=False)
class _ReaderState:
    """One reader's accumulation of every instrument."""

    reader: MetricReader
    delta: dict[type, bool]  # instrument kind -> the reader wants delta temporality
    points: dict[str, dict[frozenset[tuple[str, AttributeValue]], _Point]] = attrs.Factory(dict)
    last_collection: int = attrs.Factory(time.time_ns)


class _Instrument:
    kind: type = SdkCounter

    def __init__(self, meter: LocalMeter, name: str, unit: str, description: str) -> None:
        self.meter = meter
        self.name = name
        self.unit = unit
        self.description = description
        self.buckets = 1
        if meter.sdk_meter is not None:
            self.use_sdk(meter.sdk_meter)

    def use_sdk(self, meter: metrics.Meter) -> None:
        raise NotImplementedError

    def _points(self, attributes: AnyAttributes) -> list[_Point]:
        """This attribute set's point in every reader's accumulation (made on first use)."""
        mapping: Attributes
        if isinstance(attributes, AttributeSet):
            key, mapping = attributes.key, attributes.attributes
        else:
            key, mapping = frozenset(attributes.items()), attributes
        found = []
        for state in self.meter.readers:
            points = state.points.setdefault(self.name, {})
            point = points.get(key)
            if point is None:
                if len(points) >= CARDINALITY_LIMIT:
                    key, mapping = _OVERFLOW_KEY, _OVERFLOW_ATTRIBUTES
                    point = points.get(key)
                if point is None:
                    point = points[key] = _Point(dict(mapping), self.buckets, time.time_ns())
            found.append(point)
        return found

    def _metric(self, state: _ReaderState, now: int) -> Metric | None:
        points = state.points.get(self.name)
        if not points:
            return None
        delta = state.delta[self.kind]
        if delta:
            # A delta reader starts afresh: what it was sent is not sent again.
            state.points[self.name] = {}
        return self._export(list(points.values()), delta, state.last_collection, now)

    def _export(self, points: list[_Point], delta: bool, last_collection: int, now: int) -> Metric:
        raise NotImplementedError


class LocalCounter(_Instrument):
    """A monotonic counter, exported as the SDK exports a ``Counter``."""

    sdk: metrics.Counter | None = None

    def use_sdk(self, meter: metrics.Meter) -> None:
        self.sdk = meter.create_counter(self.name, self.unit, self.description)

    def add(self, amount: float, attributes: AnyAttributes | None = None) -> None:
        if amount < 0:
            return
        if not self.meter.readers:
            if self.sdk is not None:
                self.sdk.add(amount, _mapping(attributes))
            return
        with self.meter.lock:
            for point in self._points(attributes or {}):
                point.total += amount

    def _export(self, points: list[_Point], delta: bool, last_collection: int, now: int) -> Metric:
        data = [
            NumberDataPoint(
                attributes=point.attributes,
                start_time_unix_nano=last_collection if delta else point.started,
                time_unix_nano=now,
                value=point.total,
            )
            for point in points
        ]
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=Sum(
                data_points=data,
                aggregation_temporality=_temporality(delta),
                is_monotonic=True,
            ),
        )


class LocalHistogram(_Instrument):
    """An explicit-bucket histogram, exported as the SDK exports a ``Histogram``."""

    kind = SdkHistogram
    sdk: metrics.Histogram | None = None

    def __init__(
        self, meter: LocalMeter, name: str, unit: str, description: str, boundaries: Sequence[float]
    ) -> None:
        self.boundaries = tuple(boundaries)  # before super(): use_sdk reads them
        super().__init__(meter, name, unit, description)
        self.buckets = len(self.boundaries) + 1

    def gaps(self) -> GapHistogram:
        """A run of values to sum where they happen and :meth:`add_all` at once."""
        return GapHistogram(self.boundaries, keep_values=self.sdk is not None)

    def use_sdk(self, meter: metrics.Meter) -> None:
        self.sdk = meter.create_histogram(
            self.name,
            self.unit,
            self.description,
            explicit_bucket_boundaries_advisory=self.boundaries,
        )

    def record(self, value: float, attributes: AnyAttributes | None = None) -> None:
        if not self.meter.readers:
            if self.sdk is not None:
                self.sdk.record(value, _mapping(attributes))
            return
        index = bisect.bisect_left(self.boundaries, value)
        with self.meter.lock:
            for point in self._points(attributes or {}):
                point.counts[index] += 1
                point.count += 1
                point.total += value
                if value < point.minimum:
                    point.minimum = value
                if value > point.maximum:
                    point.maximum = value

    def add_all(self, run: GapHistogram, attributes: AnyAttributes | None = None) -> None:
        """Every value of ``run``, as if each had been recorded with ``attributes``."""
        if not run.count:
            return
        if not self.meter.readers:
            if self.sdk is not None and run.values is not None:
                for value in run.values:
                    self.sdk.record(value, _mapping(attributes))
            return
        assert run.boundaries == self.boundaries, "a run belongs to the histogram that made it"
        with self.meter.lock:
            for point in self._points(attributes or {}):
                counts = point.counts
                for index, count in enumerate(run.counts):
                    counts[index] += count
                point.count += run.count
                point.total += run.total
                point.minimum = min(point.minimum, run.minimum)
                point.maximum = max(point.maximum, run.maximum)

    def _export(self, points: list[_Point], delta: bool, last_collection: int, now: int) -> Metric:
        data = [
            HistogramDataPoint(
                attributes=point.attributes,
                start_time_unix_nano=last_collection if delta else point.started,
                time_unix_nano=now,
                count=point.count,
                sum=point.total,
                bucket_counts=tuple(point.counts),
                explicit_bounds=self.boundaries,
                min=point.minimum,
                max=point.maximum,
            )
            for point in points
        ]
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=Histogram(data_points=data, aggregation_temporality=_temporality(delta)),
        )


def _temporality(delta: bool) -> AggregationTemporality:
    return AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE


class LocalMeter:
    """The instruments of one instrumentation scope, and the readers that export them."""

    def __init__(
        self,
        resource: Resource | None = None,
        scope: InstrumentationScope | None = None,
    ) -> None:
        # Without readers (telemetry off) every record returns at once.
        self.resource = resource or Resource.get_empty()
        self.scope = scope or InstrumentationScope("llmgw")
        self.readers: list[_ReaderState] = []
        self.sdk_meter: metrics.Meter | None = None  # set by record_through (the public path)
        self.lock = threading.Lock()  # records come from the loop, collections from reader threads
        self._instruments: list[_Instrument] = []

    def create_counter(self, name: str, *, unit: str = "", description: str = "") -> LocalCounter:
        counter = LocalCounter(self, name, unit, description)
        self._instruments.append(counter)
        return counter

    def create_histogram(
        self, name: str, *, unit: str = "", description: str = "", boundaries: Sequence[float]
    ) -> LocalHistogram:
        histogram = LocalHistogram(self, name, unit, description, boundaries)
        self._instruments.append(histogram)
        return histogram

    def attach(self, reader: MetricReader) -> None:
        """Export this meter's instruments with everything else ``reader`` collects (fast path).

        Call it after the reader joined its MeterProvider, and only where
        ``METRIC_READER_HOOK`` is enabled.
        """
        state = _ReaderState(reader, wants_delta(reader))
        join_collection(reader, lambda data: self._merged(data, state))
        with self.lock:
            self.readers.append(state)

    def record_through(self, meter: metrics.Meter) -> None:
        """Record every point through ``meter``'s own instruments (the public path).

        The SDK aggregates and exports them; this meter's own aggregation stays unused.
        """
        self.sdk_meter = meter
        for instrument in self._instruments:
            instrument.use_sdk(meter)

    def _merged(self, data: MetricsData | None, state: _ReaderState) -> MetricsData | None:
        now = time.time_ns()
        with self.lock:
            metrics = [
                metric
                for instrument in self._instruments
                if (metric := instrument._metric(state, now)) is not None
            ]
            state.last_collection = now
        if not metrics:
            return data
        resources = list(data.resource_metrics) if data is not None else []
        for index, resource_metrics in enumerate(resources):
            if resource_metrics.resource is self.resource:
                resources[index] = _with_scope_metrics(resource_metrics, self.scope, metrics)
                break
        else:
            resources.append(
                ResourceMetrics(
                    resource=self.resource,
                    scope_metrics=[ScopeMetrics(scope=self.scope, metrics=metrics, schema_url="")],
                    schema_url="",
                )
            )
        return MetricsData(resource_metrics=resources)


def _with_scope_metrics(
    resource_metrics: ResourceMetrics, scope: InstrumentationScope, metrics: list[Metric]
) -> ResourceMetrics:
    """``resource_metrics`` with ``metrics`` added to ``scope``'s (made if the SDK had none)."""
    scopes: list[Any] = list(resource_metrics.scope_metrics)
    for index, scope_metrics in enumerate(scopes):
        if scope_metrics.scope == scope:
            scopes[index] = ScopeMetrics(
                scope=scope,
                metrics=[*scope_metrics.metrics, *metrics],
                schema_url=scope_metrics.schema_url,
            )
            break
    else:
        scopes.append(ScopeMetrics(scope=scope, metrics=metrics, schema_url=""))
    return ResourceMetrics(
        resource=resource_metrics.resource,
        scope_metrics=scopes,
        schema_url=resource_metrics.schema_url,
    )
