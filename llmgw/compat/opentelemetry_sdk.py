"""opentelemetry-sdk's private names: the metric reader hook of ``telemetry.local_metrics``.

The public path (:meth:`LocalMeter.record_through`) records every point through the SDK's own
instruments; this fast path lets the gateway aggregate its points itself and joins them to what a
reader collects, by wrapping the collect callback the MeterProvider installs on each reader.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.metrics import Counter, Histogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, MetricsData

from llmgw.compat import FastPath

__all__ = ["LEAN_TRACER", "METRIC_READER_HOOK", "join_collection", "wants_delta"]

METRIC_READER_HOOK = FastPath("metric-reader-hook", "opentelemetry-sdk", (1, 43), (1, 46))
# telemetry.lean_tracing reproduces these versions' spans (ids, flags, limits, dropped counts) from
# the SDK tracer's parts; elsewhere the SDK's own tracer runs.
LEAN_TRACER = FastPath("lean-tracer", "opentelemetry-sdk", (1, 43), (1, 46))


def wants_delta(reader: MetricReader) -> dict[type, bool]:
    """Per public instrument class (Counter, Histogram): whether ``reader`` exports deltas."""
    # The SDK keys a reader's temporalities by its internal instrument classes, which are
    # subclasses of the public ones.
    temporality: Mapping[Any, AggregationTemporality] = reader._instrument_class_temporality
    return {
        public: any(
            issubclass(kind, public) and chosen is AggregationTemporality.DELTA
            for kind, chosen in temporality.items()
        )
        for public in (Counter, Histogram)
    }


def join_collection(
    reader: MetricReader, merge: Callable[[MetricsData | None], MetricsData | None]
) -> None:
    """Pass everything ``reader`` collects through ``merge`` before the reader exports it.

    Call it after the reader joined its MeterProvider (which installs the collect callback).
    """
    # Typed in the SDK as an older signature; it is MeasurementConsumer.collect.
    collect: Any = reader._collect
    if collect is None:
        raise RuntimeError("join a reader's collection after its MeterProvider was built")

    def collect_and_merge(
        reader: MetricReader, timeout_millis: float = 10_000
    ) -> MetricsData | None:
        return merge(collect(reader, timeout_millis=timeout_millis))

    reader._collect = collect_and_merge  # type: ignore[assignment]
