"""The telemetry handles the app uses at run time: a tracer, the instruments, the capture switch."""

from __future__ import annotations

import attrs
from opentelemetry import trace

from llmgw import __version__
from llmgw.telemetry.genai import GatewayInstruments
from llmgw.telemetry.lean_tracing import tracer_for
from llmgw.telemetry.setup import TelemetryProviders

__all__ = ["Telemetry"]


@attrs.frozen
class Telemetry:
    providers: TelemetryProviders
    tracer: trace.Tracer
    instruments: GatewayInstruments
    capture_content: bool

    @classmethod
    def from_providers(cls, providers: TelemetryProviders, *, capture_content: bool) -> Telemetry:
        return cls(
            providers=providers,
            tracer=tracer_for(providers.tracer_provider, "llmgw", __version__),
            instruments=GatewayInstruments(providers.local_meter),
            capture_content=capture_content,
        )
