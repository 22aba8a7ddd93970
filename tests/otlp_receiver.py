"""A local OTLP/HTTP receiver (protobuf) that decodes and keeps what gateways export."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.processes import serve_here


def plain_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(plain_value(item) for item in value.array_value.values)
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.metrics: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post("/v1/metrics", self._metrics)
        self._runner, self.port = await serve_here(app)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _traces(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in message.resource_spans:
            self.resources.append(
                {a.key: plain_value(a.value) for a in resource_spans.resource.attributes}
            )
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)
        return web.Response(content_type="application/x-protobuf")

    async def _metrics(self, request: web.Request) -> web.Response:
        message = ExportMetricsServiceRequest.FromString(await request.read())
        for resource_metrics in message.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                self.metrics.extend(scope.metrics)
        return web.Response(content_type="application/x-protobuf")

    def span_attributes(self, name: str) -> list[dict[str, Any]]:
        return [
            {a.key: plain_value(a.value) for a in span.attributes}
            for span in self.spans
            if span.name == name
        ]
