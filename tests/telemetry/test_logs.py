"""JSON log lines: the formatter writes what it always wrote, and the handler writes every line, in
order, in few writes, an error at once and the rest within the interval or at exit."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import sys
import threading
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from llmgw.api import pipeline
from llmgw.storage import api_keys
from llmgw.telemetry.logs import REQUEST_ID, BatchingStreamHandler, JsonFormatter, configure_logging
from llmgw.telemetry.redact import redact
from tests.conftest import Gateway, StartGateways, gateway_env
from tests.fake_venice import FakeVenice
from tests.processes import REPO_ROOT, wait_until
from tests.usage_records import usage_record

_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def reference_format(record: logging.LogRecord, worker: int | None = None) -> str:
    """JsonFormatter.format as it was before it was made cheaper: what every line must still be."""
    entry: dict[str, Any] = {
        "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "message": record.getMessage(),
        "request_id": REQUEST_ID.get(),
    }
    if worker is not None:
        entry["worker"] = worker
    span_context = trace.get_current_span().get_span_context()
    entry["trace_id"] = format(span_context.trace_id, "032x") if span_context.is_valid else None
    for name, value in vars(record).items():
        if name not in _STANDARD_ATTRIBUTES:
            entry[name] = value
    if record.exc_info and record.exc_info[0] is not None:
        entry["exception"] = record.exc_info[0].__name__
        entry["exception_message"] = redact(str(record.exc_info[1]))
        raised = traceback.extract_tb(record.exc_info[2])[-1]
        where = os.path.relpath(raised.filename, REPO_ROOT)
        entry["exception_at"] = f"{where}:{raised.lineno} in {raised.name}"
    return orjson.dumps(entry, default=str).decode()


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def logged(log: Callable[[logging.Logger], None]) -> logging.LogRecord:
    """The record a real logging call makes."""
    logger = logging.Logger("llmgw.test")
    records = Records()
    logger.addHandler(records)
    log(logger)
    (record,) = records.records
    return record


def billing_fields() -> dict[str, Any]:
    record = usage_record(
        api_key_id=uuid.uuid4(),
        subject_id=uuid.uuid4(),
        model="qwen3-5-9b",
        cost_usd=0.00010471875,
        trace_id="0af7651916cd43dd8448eb211c80319c",
    )
    return {"event": "llmgw.billing", **record.log_fields()}


def exception(logger: logging.Logger) -> None:
    try:
        raise ConnectionResetError("upstream hung up")
    except ConnectionResetError:
        logger.exception("upstream %s failed", "venice")


RECORDS: dict[str, Callable[[logging.Logger], None]] = {
    "plain": lambda log: log.info("llmgw listening"),
    "args": lambda log: log.warning("worker %d serving (pid %d)", 2, 4242),
    "a mapping as args": lambda log: log.info("%(what)s", {"what": "reloaded"}),
    "percent without args": lambda log: log.info("100% %s kept as written"),
    "billing": lambda log: log.info("billing record", extra=billing_fields()),
    "exc_info": exception,
    "extra over the entry's own keys": lambda log: log.info(
        "x", extra={"level": "custom", "worker": 9, "exception": "mine", "request_id": "given"}
    ),
    "values that are not JSON types": lambda log: log.info(
        "é ✓ \u2028", extra={"key": uuid.UUID(int=7), "cost": Decimal("0.1"), "t": (1, "a")}
    ),
}


@pytest.fixture(params=[None, "req-1"], ids=["no request id", "request id"])
def request_id(request: pytest.FixtureRequest) -> Iterator[None]:
    token = REQUEST_ID.set(request.param)
    yield
    REQUEST_ID.reset(token)


@pytest.fixture(params=[False, True], ids=["no span", "span"])
def span(request: pytest.FixtureRequest) -> Iterator[None]:
    if not request.param:
        yield
        return
    with trace.use_span(
        TracerProvider().get_tracer("test").start_span("POST /v1/chat/completions")
    ):
        yield


@pytest.mark.usefixtures("request_id", "span")
@pytest.mark.parametrize("worker", [None, 3])
@pytest.mark.parametrize("make", RECORDS.values(), ids=RECORDS.keys())
def test_every_line_is_what_the_formatter_wrote_before(
    make: Callable[[logging.Logger], None], worker: int | None
) -> None:
    record = logged(make)
    assert JsonFormatter(worker=worker).format(record) == reference_format(record, worker)


def test_a_record_another_formatter_saw_first_is_written_as_before() -> None:
    # logging.Formatter adds message and asctime to the record, after the extra fields.
    record = logged(lambda log: log.info("billing record", extra=billing_fields()))
    logging.Formatter("%(asctime)s %(message)s").format(record)
    record.added_by_a_filter = True
    assert JsonFormatter().format(record) == reference_format(record)


def test_a_record_missing_a_standard_attribute_is_written_as_before() -> None:
    record = logged(lambda log: log.info("billing record", extra=billing_fields()))
    del record.funcName
    assert JsonFormatter().format(record) == reference_format(record)


@given(st.floats(min_value=0, max_value=2**34, allow_nan=False))
def test_the_timestamp_is_what_datetime_wrote(created: float) -> None:
    record = logged(lambda log: log.info("at"))
    record.created = created
    assert JsonFormatter().format(record) == reference_format(record)


@pytest.mark.parametrize(
    "created",
    [-1.25, 0.0, 1.0, 1.0005, 1.9994999, 1.9995, 1.9999995, 1.99999949, 1_780_000_000.9999997],
)
def test_the_timestamp_rounds_as_datetime_does(created: float) -> None:
    formatter = JsonFormatter()
    for repeat in (created, created + 1, created):  # also a second leaving the cache and back
        record = logged(lambda log: log.info("at"))
        record.created = repeat
        assert formatter.format(record) == reference_format(record)


# ---------------------------------------------------------------------------------------------
# Exceptions: the message (redacted) and where it was raised, never a secret

SECRETS_IN_MESSAGES = {
    "a gateway key": "llmg_Zx81bQ0DW4Wc0zEZ5jBw3ZxQy3N7yHR-yxD3OB1eXKw",
    "a provider key": "sk-proj-4fG7hJ2kL9mN0pQ3rS6tU8vW1xY5zA",
    "a bearer token": "Bearer tok.en-without-digits",
    "a named token": 'api_key="s3cr3t"',
    "a URL's password": "postgresql://llmgw:hunter2@db:5432/llmgw",
}


@pytest.mark.parametrize("secret", SECRETS_IN_MESSAGES.values(), ids=SECRETS_IN_MESSAGES.keys())
def test_an_exception_message_is_logged_without_the_secrets_it_quotes(secret: str) -> None:
    def fail() -> None:
        raise ValueError(f"could not use {secret} for the request to model qwen3-5-9b")

    def log_it(logger: logging.Logger) -> None:
        try:
            fail()
        except ValueError:
            logger.exception("unexpected error")

    line = orjson.loads(JsonFormatter().format(logged(log_it)))
    message = line["exception_message"]
    assert message.startswith("could not use ") and "[redacted]" in message
    assert message.endswith(" for the request to model qwen3-5-9b")  # the rest stays readable
    for part in ("Zx81bQ0DW4", "4fG7hJ2kL9", "tok.en", "s3cr3t", "hunter2"):
        assert part not in message
    line_number = fail.__code__.co_firstlineno + 1
    assert line["exception_at"] == f"tests/telemetry/test_logs.py:{line_number} in fail"
    assert "exception_via" not in line  # raised in no library: nothing to add


def test_the_gateways_own_secrets_are_redacted_whatever_their_shape() -> None:
    admin_token = "correct-horse-battery-staple"  # no digit: no pattern would know it

    def log_it(logger: logging.Logger) -> None:
        try:
            raise RuntimeError(f"token {admin_token!r} refused; x kept")
        except RuntimeError:
            logger.exception("unexpected error")

    formatter = JsonFormatter(secrets=[admin_token, "x"])  # "x": too short to redact
    line = orjson.loads(formatter.format(logged(log_it)))
    assert line["exception_message"] == "token '[redacted]' refused; x kept"


async def test_a_500_is_logged_with_the_message_and_where_it_was_raised(
    gateway: Gateway, api_key: str, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    def fail(document: dict[str, Any]) -> int:
        raise KeyError(f"no choices for {api_key} in the answer")

    monkeypatch.setattr(pipeline, "answer_output_chars", fail)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {api_key}"},
        ) as response:
            assert response.status == 500
    [record] = [r for r in caplog.records if r.exc_info and r.levelno == logging.ERROR]
    line = orjson.loads(JsonFormatter().format(record))
    assert line["message"] == "unexpected error while handling POST /v1/chat/completions"
    assert line["exception"] == "KeyError"
    assert line["exception_message"] == "'no choices for [redacted] in the answer'"
    assert line["exception_at"] == (
        f"tests/telemetry/test_logs.py:{fail.__code__.co_firstlineno + 1} in fail"
    )
    # Raised outside llmgw: the innermost frame of llmgw's own code says where it was called.
    assert line["exception_via"].startswith("llmgw/api/pipeline.py:")
    assert line["exception_via"].endswith(" in _complete")


# ---------------------------------------------------------------------------------------------
# Batches


class Stream(io.StringIO):
    """A stderr that keeps each write (``fileno``: a pipe's, to be taken for one)."""

    def __init__(self, fileno: int | None = None) -> None:
        super().__init__()
        self.writes: list[str] = []
        self._fileno = fileno

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)

    def fileno(self) -> int:
        return super().fileno() if self._fileno is None else self._fileno


@pytest.fixture
def stream() -> Stream:
    return Stream()


@pytest.fixture
def start_logger() -> Iterator[Callable[..., tuple[logging.Logger, BatchingStreamHandler]]]:
    """``start(stream, **handler_arguments)``: a logger writing JSON lines through a new handler."""
    handlers: list[BatchingStreamHandler] = []

    def start(
        stream: io.StringIO, **arguments: Any
    ) -> tuple[logging.Logger, BatchingStreamHandler]:
        handler = BatchingStreamHandler(stream, **{"interval": 60.0, **arguments})
        handler.setFormatter(JsonFormatter())
        handlers.append(handler)
        logger = logging.Logger("llmgw.test")
        logger.addHandler(handler)
        return logger, handler

    yield start
    for handler in handlers:
        handler.close()


def messages(text: str) -> list[str]:
    return [orjson.loads(line)["message"] for line in text.splitlines()]


def test_many_lines_go_out_in_few_writes_all_of_them_in_order(
    start_logger: Any, stream: Stream
) -> None:
    logger, handler = start_logger(stream)
    for number in range(2000):
        logger.info("billing record %d", number, extra=billing_fields())
    handler.flush()
    assert messages(stream.getvalue()) == [f"billing record {number}" for number in range(2000)]
    assert len(stream.writes) <= len(stream.getvalue()) // (64 * 1024) + 1
    assert all(write.endswith("\n") for write in stream.writes)


def test_a_warning_goes_out_at_once_with_the_lines_before_it(
    start_logger: Any, stream: Stream
) -> None:
    logger, _ = start_logger(stream)
    logger.info("first")
    logger.info("second")
    assert stream.writes == []
    logger.warning("upstream refused the key")
    assert messages(stream.getvalue()) == ["first", "second", "upstream refused the key"]
    assert len(stream.writes) == 1
    logger.error("and an error")
    assert messages(stream.writes[-1]) == ["and an error"]


def test_a_line_goes_out_within_the_interval_with_nothing_after_it(
    start_logger: Any, stream: Stream
) -> None:
    logger, _ = start_logger(stream, interval=0.05)
    logger.info("alone")
    wait_until(lambda: messages(stream.getvalue()) == ["alone"], what="the line is written")
    logger.info("later")
    wait_until(
        lambda: messages(stream.getvalue()) == ["alone", "later"], what="the next one is too"
    )


def test_close_writes_the_rest_and_stops_the_flusher(start_logger: Any, stream: Stream) -> None:
    before = set(threading.enumerate())
    logger, handler = start_logger(stream)
    (flusher,) = [thread for thread in set(threading.enumerate()) - before if thread.daemon]
    logger.info("waiting")
    assert stream.getvalue() == ""
    handler.close()
    assert messages(stream.getvalue()) == ["waiting"]
    flusher.join(timeout=10)
    assert not flusher.is_alive()
    logger.info("after close")  # logging at exit still gets written, at once
    assert messages(stream.getvalue()) == ["waiting", "after close"]


def test_logging_shutdown_writes_the_rest(start_logger: Any, stream: Stream) -> None:
    logger, handler = start_logger(stream)
    logger.info("at exit")
    # What the atexit hook of logging does, for this handler only; it holds the handler's lock.
    logging.shutdown([weakref.ref(handler)])
    assert messages(stream.getvalue()) == ["at exit"]


def test_lines_from_many_threads_are_all_written_whole(start_logger: Any, stream: Stream) -> None:
    logger, handler = start_logger(stream, interval=0.001, batch_bytes=4096)

    def log(thread: int) -> None:
        for number in range(300):
            logger.info("%d %d", thread, number)

    threads = [threading.Thread(target=log, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    handler.flush()
    lines = [message.split() for message in messages(stream.getvalue())]
    for thread in range(4):
        assert [int(n) for t, n in lines if int(t) == thread] == list(range(300))


def test_on_a_pipe_no_write_is_longer_than_pipe_buf(start_logger: Any) -> None:
    read_end, write_end = os.pipe()
    try:
        stream = Stream(fileno=write_end)
        logger, handler = start_logger(stream)
        for number in range(200):
            logger.info("billing record %d ✓", number, extra=billing_fields())
        handler.flush()
    finally:
        os.close(read_end)
        os.close(write_end)
    assert messages(stream.getvalue()) == [f"billing record {n} ✓" for n in range(200)]
    assert all(len(write.encode()) <= 4096 and write.endswith("\n") for write in stream.writes)
    assert len(stream.writes) < 200


class BrokenPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("broken", [BrokenPipe, "closed"])
def test_a_stderr_that_fails_is_reported_never_raised(
    start_logger: Any, broken: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    if broken == "closed":
        stream = io.StringIO()
        stream.close()
    else:
        stream = broken()
    logger, handler = start_logger(stream)
    logger.info("lost")
    logger.error("lost too")  # the write in the request's own path
    handler.flush()
    assert "--- Logging error ---" in capsys.readouterr().err


def test_a_closed_sys_stderr_too_is_never_raised(
    start_logger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    logger, _ = start_logger(closed)
    logger.error("nowhere to go")


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Puts back what configure_logging changes for the whole process."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    yield
    for handler in root.handlers:
        handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    (logging.logThreads, logging.logProcesses, logging.logMultiprocessing) = flags


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_batches_json_lines_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", worker=2)
    logging.getLogger("llmgw.billing").info("billing record", extra=billing_fields())
    (handler,) = logging.getLogger().handlers
    handler.flush()
    (line,) = capsys.readouterr().err.splitlines()
    assert orjson.loads(line)["worker"] == 2
    assert orjson.loads(line)["event"] == "llmgw.billing"


# ---------------------------------------------------------------------------------------------
# A real serve process


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_serve_writes_the_billing_line_before_it_exits_on_sigterm(
    gateway_processes: StartGateways,
    database_url: str,
    db: asyncpg.Connection,
    fake_venice: FakeVenice,
    workers: str,
) -> None:
    key = (await api_keys.create_key(db, api_keys.KeySettings(name="logs"))).plaintext
    (process,) = gateway_processes(
        gateway_env(database_url, fake_venice.base_url, LLMGW_WORKERS=workers)
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{process.url}/v1/chat/completions",
            json={"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": "billed-at-exit"},
        ) as response,
    ):
        assert response.status == 200
        await response.read()
    assert await asyncio.to_thread(process.stop) == 0
    (record,) = [r for r in process.billing_records() if r["request_id"] == "billed-at-exit"]
    assert record["outcome"] == "completed"
    assert process.records()[-1]["message"] == "llmgw stopped"
    assert process.problems() == []
