"""OTLP export: over HTTP by default, gRPC only when asked for and only from the [grpc] extra."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)

from llmgw.compat.opentelemetry_exporter_otlp import FastOTLPSpanExporter
from llmgw.config import ConfigError
from llmgw.telemetry import setup

GRPC_MODULES = (
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
)


def test_http_is_the_default_and_loads_no_grpc() -> None:
    probe = (
        "import sys\n"
        "from llmgw.config import load_settings\n"
        "from llmgw.telemetry.setup import build_providers\n"
        "providers = build_providers(load_settings())\n"
        "providers.shutdown()\n"
        "print(sorted(m for m in sys.modules if 'grpc' in m))\n"
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_http_exporters_without_a_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    spans, _ = setup._otlp_exporters()
    assert isinstance(spans, FastOTLPSpanExporter)  # our encoder in the official exporter


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
def test_grpc_when_asked(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, "grpc")
    spans, metrics = setup._otlp_exporters()
    assert isinstance(spans, GrpcSpanExporter)
    spans.shutdown()
    metrics.shutdown()


def test_grpc_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    for module in GRPC_MODULES:
        monkeypatch.setitem(sys.modules, module, None)  # what a missing package looks like
    with pytest.raises(ConfigError) as refused:
        setup._otlp_exporters()
    message = str(refused.value)
    assert message.startswith("OTEL_EXPORTER_OTLP_PROTOCOL has invalid value 'grpc'")
    assert "pip install 'llmgw[grpc]'" in message
