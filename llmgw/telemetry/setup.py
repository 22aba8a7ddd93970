"""Tracer and meter providers: OTLP export when configured, nothing at all otherwise.

Providers are built here and injected into the app; nothing is installed globally, so tests can
pass in-memory ones and several apps can run in one process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
from opentelemetry import metrics, trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NoOpTracerProvider

from llmgw import __version__
from llmgw.compat.opentelemetry_sdk import METRIC_READER_HOOK
from llmgw.config import ConfigError, Settings
from llmgw.telemetry.local_metrics import LocalMeter

__all__ = ["SHUTDOWN_SECONDS", "TelemetryProviders", "build_providers", "build_resource"]

log = logging.getLogger(__name__)

# How long the last export may take at shutdown; an unresponsive collector costs no more than this.
SHUTDOWN_SECONDS = 3.0


@attrs.frozen
class TelemetryProviders:
    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider
    # The gateway's own instruments, exported by the meter provider's readers.
    local_meter: LocalMeter = attrs.field(factory=LocalMeter)
    # Set when LLMGW_PROMETHEUS=true: the registry GET /metrics renders.
    prometheus_registry: Any = None  # a prometheus_client.CollectorRegistry

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> bool:
        """Export what is pending and stop, waiting at most ``timeout`` seconds; False if cut short.

        The exporters block on their collector (and retry) for up to their own timeouts, so they
        run in a daemon thread the process does not wait for once ``timeout`` has passed.
        """
        worker = threading.Thread(
            target=self._shutdown_providers,
            args=(timeout,),
            name="llmgw-telemetry-shutdown",
            daemon=True,
        )
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            log.warning(
                "telemetry export did not finish within %gs at shutdown; what was pending is lost",
                timeout,
            )
            return False
        return True

    def _shutdown_providers(self, timeout: float) -> None:
        if isinstance(self.tracer_provider, TracerProvider):
            self.tracer_provider.shutdown()
        if isinstance(self.meter_provider, MeterProvider):
            self.meter_provider.shutdown(timeout_millis=timeout * 1000)


def build_resource(service_name: str) -> Resource:
    return Resource.create(
        {
            "service.name": service_name,
            "service.version": __version__,
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        }
    )


def build_providers(
    settings: Settings,
    *,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
) -> TelemetryProviders:
    """OTLP exporters when OTEL_EXPORTER_OTLP_ENDPOINT is set, plus any processors/readers given."""
    processors = list(span_processors)
    readers = list(metric_readers)
    prometheus_registry = None
    if settings.prometheus:
        # Imported only when asked for: prometheus_client costs ~16 MiB of memory.
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry

        prometheus_registry = CollectorRegistry(auto_describe=True)
        readers.append(PrometheusMetricReader(registry=prometheus_registry))
    if settings.otel_exporter_otlp_endpoint is not None:
        span_exporter, metric_exporter = _otlp_exporters()
        processors.append(BatchSpanProcessor(span_exporter))
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    resource = build_resource(settings.otel_service_name)
    tracer_provider: trace.TracerProvider
    if processors:
        # shutdown_on_exit=False: an atexit shutdown would wait on the collector without bound.
        sdk_tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in processors:
            sdk_tracer_provider.add_span_processor(processor)
        tracer_provider = sdk_tracer_provider
    else:
        tracer_provider = NoOpTracerProvider()
    meter_provider: metrics.MeterProvider = (
        MeterProvider(
            resource=resource,
            metric_readers=readers,
            shutdown_on_exit=False,
            **_exemplar_settings(),
        )
        if readers
        else NoOpMeterProvider()
    )
    local_meter = LocalMeter(resource, InstrumentationScope("llmgw", __version__))
    # OTEL_SDK_DISABLED turns the SDK's own instruments into no-ops; the gateway's follow it.
    if readers and os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() != "true":
        if METRIC_READER_HOOK.enabled():
            for reader in readers:
                local_meter.attach(reader)
        else:
            local_meter.record_through(meter_provider.get_meter("llmgw", __version__))
    return TelemetryProviders(tracer_provider, meter_provider, local_meter, prometheus_registry)


def _exemplar_settings() -> dict[str, Any]:
    # llmgw emits no exemplars; offering each measurement to a reservoir costs ~20% of a record.
    # An operator who wants them sets OTEL_METRICS_EXEMPLAR_FILTER and gets the SDK's behaviour.
    if os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER"):
        return {}
    return {"exemplar_filter": AlwaysOffExemplarFilter()}


def _otlp_exporters() -> tuple[SpanExporter, MetricExporter]:
    # The exporters read the standard OTEL_EXPORTER_OTLP_* variables (endpoint, headers, timeouts).
    variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    if variable not in os.environ:
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = os.environ.get(variable, "")
    if protocol.strip().lower() == "grpc":
        # Imported only when asked for: gRPC is an extra (grpcio is large and compiled).
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:
            raise ConfigError(
                variable,
                protocol,
                "http/protobuf, or install the gRPC exporter with pip install 'llmgw[grpc]'",
            ) from None
        return GrpcSpanExporter(), GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    # The official span exporter with our encoder: its protobuf encoding costs ~4x the CPU.
    from llmgw.compat.opentelemetry_exporter_otlp import FastOTLPSpanExporter
    from llmgw.telemetry.span_encoding import SpanEncoder

    return FastOTLPSpanExporter(encode_spans=SpanEncoder().encode_spans), OTLPMetricExporter()
