"""Building and stopping the telemetry providers: stopping takes a bounded time, whatever the
exporter does, and OTEL_SDK_DISABLED silences the gateway's own metrics too."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from llmgw.compat import PUBLIC_APIS_ONLY_VARIABLE
from llmgw.config import Settings
from llmgw.telemetry.genai import GatewayInstruments
from llmgw.telemetry.semconv import METRIC_GATEWAY_REQUESTS
from llmgw.telemetry.setup import build_providers


class StuckExporter(SpanExporter):
    """A collector that never answers: every export blocks until the test releases it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.exports = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exports += 1
        self.release.wait(60)
        return SpanExportResult.FAILURE


def test_shutdown_gives_up_on_a_stuck_exporter_after_its_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = StuckExporter()
    providers = build_providers(Settings(), span_processors=[BatchSpanProcessor(exporter)])
    with providers.tracer_provider.get_tracer("test").start_as_current_span("pending"):
        pass
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="llmgw.telemetry.setup"):
            assert providers.shutdown(timeout=0.5) is False
        assert time.monotonic() - started < 2.0
        assert exporter.exports == 1
        assert "telemetry export did not finish within 0.5s" in caplog.text
    finally:
        exporter.release.set()


def test_shutdown_reports_success_when_the_exporter_answers() -> None:
    exporter = StuckExporter()
    exporter.release.set()
    providers = build_providers(Settings(), span_processors=[BatchSpanProcessor(exporter)])
    with providers.tracer_provider.get_tracer("test").start_as_current_span("pending"):
        pass
    assert providers.shutdown(timeout=5) is True


@pytest.mark.parametrize("public_apis_only", [False, True], ids=["reader-hook", "public-api"])
@pytest.mark.parametrize("disabled", [False, True])
def test_the_gateways_metrics_follow_otel_sdk_disabled(
    monkeypatch: pytest.MonkeyPatch, disabled: bool, public_apis_only: bool
) -> None:
    if disabled:
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv(PUBLIC_APIS_ONLY_VARIABLE, str(public_apis_only).lower())
    reader = InMemoryMetricReader()
    providers = build_providers(Settings(), metric_readers=[reader])
    GatewayInstruments(providers.local_meter).requests.add(1, {"http.route": "/v1/models"})
    data = reader.get_metrics_data()
    names = {
        metric.name
        for resource in (data.resource_metrics if data is not None else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert (METRIC_GATEWAY_REQUESTS in names) is not disabled
    # Which path carried them: the gateway's own aggregation, or the SDK's instruments.
    hooked = bool(providers.local_meter.readers)
    assert hooked is (not disabled and not public_apis_only)
