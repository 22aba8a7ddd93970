"""opentelemetry-exporter-otlp-proto-http's private names: the span exporter with another encoder.

``export`` is opentelemetry-exporter-otlp-proto-http 1.45.2's, step for step, with the encoder
swapped (telemetry's ``SpanEncoder`` costs about a quarter of the official encoder's CPU). It uses that
version's private attributes and helpers, so it runs only where ``OTLP_SPAN_EXPORT`` is enabled;
elsewhere it is the official ``export`` unchanged: an upgrade costs speed, never spans.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE

from llmgw.compat import FastPath

try:
    from opentelemetry.exporter.otlp.proto.http._common import (
        RequestPayloadTooLargeError,
        _is_request_too_large,
    )
except ImportError:
    _HAS_HELPERS = False
else:
    _HAS_HELPERS = True

__all__ = ["OTLP_SPAN_EXPORT", "FastOTLPSpanExporter"]

OTLP_SPAN_EXPORT = FastPath(
    "otlp-span-export", "opentelemetry-exporter-otlp-proto-http", (1, 45), (1, 46)
)

# The official exporter's logger, so logging configured for it still applies.
_logger = logging.getLogger(OTLPSpanExporter.__module__)


class FastOTLPSpanExporter(OTLPSpanExporter):
    """The official exporter, its batches encoded by ``encode_spans`` (the protobuf request's
    bytes, as the official encoder's ``SerializePartialToString()`` gives them)."""

    def __init__(
        self, *args: Any, encode_spans: Callable[[Sequence[ReadableSpan]], bytes], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._encode_spans = encode_spans
        # _HAS_HELPERS: a version outside the verified range may not even have the module.
        self._own_export = _HAS_HELPERS and OTLP_SPAN_EXPORT.enabled()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._own_export:
            return super().export(spans)
        if self._shutdown:
            _logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE

        with self._metrics.export_operation(len(spans)) as result:
            try:
                serialized_data = self._encode_spans(spans)
            except Exception as error:
                _logger.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE

            if _is_request_too_large(serialized_data, self._max_request_size):
                _logger.warning(
                    "Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                    len(serialized_data),
                    self._max_request_size,
                )
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(serialized_data)} "
                    f"bytes exceeds max_request_size "
                    f"{self._max_request_size} bytes."
                )
                return SpanExportResult.FAILURE

            export_result = self._client.export(serialized_data)
            if not export_result.success:
                result.error = export_result.error
                result.error_attrs = (
                    {HTTP_RESPONSE_STATUS_CODE: export_result.status_code}
                    if export_result.status_code is not None
                    else None
                )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
