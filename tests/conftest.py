"""Shared fixtures: one real Postgres per test run, a real fake-Venice server, the real app.

Postgres is the embedded one unless LLMGW_TEST_DATABASE_URL names a server; either way a fresh
database is created for the run, migrated to head, and emptied before each test that uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import anthropic
import asyncpg
import attrs
import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Middleware
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llmgw import app_keys
from llmgw.app import create_app
from llmgw.body_memory import BodyLimit, BodyLimits, BodyMemory
from llmgw.cli import main
from llmgw.clocks import SYSTEM_CLOCKS, Clocks
from llmgw.config import Settings, venice_provider
from llmgw.lifecycle.reload import RequestGenerations
from llmgw.middleware import gateway_middleware
from llmgw.storage import api_keys, migrations
from llmgw.storage.embedded import start_embedded
from llmgw.storage.schema import metadata
from llmgw.telemetry.refusals import RefusalLog
from llmgw.telemetry.runtime import Telemetry
from llmgw.telemetry.setup import build_providers
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.otlp_receiver import OtlpReceiver
from tests.processes import (
    LoopbackProcess,
    answers_http,
    clean_env,
    free_port,
    serve,
    stop,
    wait_until,
)
from tests.processes import eventually as eventually  # many tests import it from here

_TABLES_TO_EMPTY = tuple(table.name for table in metadata.sorted_tables)


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at another database (works for socket URLs too)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def _create_database(admin_url: str, name: str) -> None:
    connection = await asyncpg.connect(admin_url)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()


async def _drop_database(admin_url: str, name: str) -> None:
    connection = await asyncpg.connect(admin_url)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


@attrs.frozen
class PostgresServer:
    """Admin access to the test server, to make throwaway databases (migration tests)."""

    admin_url: str

    def new_database(self, name: str) -> str:
        asyncio.run(_create_database(self.admin_url, name))
        return with_database(self.admin_url, name)

    def drop_database(self, name: str) -> None:
        asyncio.run(_drop_database(self.admin_url, name))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    external = os.environ.get("LLMGW_TEST_DATABASE_URL")
    if external:
        yield PostgresServer(external)
        return
    with tempfile.TemporaryDirectory(prefix="llmgw-test-pg-") as data_dir:
        os.chmod(data_dir, 0o755)  # the embedded server runs as its own user when we are root
        yield PostgresServer(start_embedded(Path(data_dir)))


@pytest.fixture(scope="session")
def database_url(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"llmgw_test_{os.getpid()}"
    url = postgres_server.new_database(name)
    migrations.upgrade(url)
    yield url
    postgres_server.drop_database(name)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the test database, emptied before the test."""
    connection = await asyncpg.connect(database_url)
    await connection.execute(f"TRUNCATE {', '.join(_TABLES_TO_EMPTY)} CASCADE")
    yield connection
    await connection.close()


@pytest.fixture
async def fake_venice() -> AsyncIterator[FakeVenice]:
    async with FakeVenice() as fake:
        yield fake


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    """A local OTLP/HTTP collector that decodes and keeps what is exported to it."""
    otlp = OtlpReceiver()
    await otlp.start()
    yield otlp
    await otlp.close()


@attrs.frozen
class InMemoryTelemetry:
    telemetry: Telemetry
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def finished_spans(self) -> list[Any]:
        return list(self.spans.get_finished_spans())

    def span(self, name: str) -> Any:
        matching = [span for span in self.finished_spans() if span.name == name]
        assert len(matching) == 1, [span.name for span in self.finished_spans()]
        return matching[0]

    def metric_points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        points: list[Any] = []
        if data is None:
            return points
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


def fresh_data_dir() -> Path:
    """A data dir of its own for a test's gateway: its ledger spool is never another test's (nor
    in the user's data dir)."""
    return Path(tempfile.mkdtemp(prefix="llmgw-test-data-"))


def make_settings(fake: FakeVenice, database_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": fresh_data_dir(),
        "database_url": database_url,
        "environment_provider": venice_provider(FAKE_VENICE_KEY, fake.base_url),
        "request_timeout_seconds": 5.0,
        "upstream_max_retries": 2,
    }
    values.update(overrides)
    return Settings(**values)


def make_telemetry(settings: Settings) -> InMemoryTelemetry:
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    providers = build_providers(
        settings, span_processors=[SimpleSpanProcessor(spans)], metric_readers=[reader]
    )
    telemetry = Telemetry.from_providers(providers, capture_content=settings.capture_genai_content)
    return InMemoryTelemetry(telemetry, spans, reader)


def middleware_alone(telemetry: Telemetry, **overrides: Any) -> Middleware:
    """The gateway's middleware for an application of a test's own routes: every route public
    unless ``public_paths`` says otherwise, the default body limits."""
    settings = Settings()
    values: dict[str, Any] = {
        "refusals": RefusalLog(),
        "generations": RequestGenerations(),
        "body_limits": BodyLimits(
            BodyLimit(settings.request_body_limit_bytes, "REQUEST_BODY_LIMIT_BYTES"),
            {},
            BodyMemory(settings.request_body_memory_bytes),
        ),
        "public_prefixes": ("/",),
    }
    values.update(overrides)
    return gateway_middleware(telemetry=telemetry, **values)


@attrs.frozen
class Answered:
    """An HTTP answer, read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@attrs.define
class Gateway:
    """A running gateway on a real loopback port, with its telemetry and the fake behind it."""

    server: TestServer
    fake: FakeVenice
    telemetry: InMemoryTelemetry
    db: asyncpg.Connection
    # The SDK clients a test made (client, anthropic_client): closed with the gateway, in the
    # test's own loop. One left to the garbage collector closes itself in a task of a loop that
    # is gone, and asyncio logs that task's error in whichever test is running then.
    sdk_clients: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = attrs.field(factory=list)

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("/v1"))

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def create_key(self, **settings: Any) -> str:
        issued = await api_keys.create_key(
            self.db, api_keys.KeySettings(name=settings.pop("name", "test"), **settings)
        )
        return issued.plaintext

    def client(self, key: str, **kwargs: Any) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=0, **kwargs)
        self.sdk_clients.append(client)
        return client

    def anthropic_client(self, key: str, **kwargs: Any) -> anthropic.AsyncAnthropic:
        """The Anthropic SDK, as Claude Code's users point it: the root URL, the key as api_key."""
        client = anthropic.AsyncAnthropic(
            base_url=self.url("/"), api_key=key, max_retries=0, **kwargs
        )
        self.sdk_clients.append(client)
        return client

    async def close_sdk_clients(self) -> None:
        for client in self.sdk_clients:
            await client.close()
        self.sdk_clients.clear()

    async def post(self, path: str, key: str, body: Any) -> Answered:
        """``body`` POSTed as JSON to ``path``, ``key`` the bearer token; the answer read whole."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.url(path), json=body, headers={"Authorization": f"Bearer {key}"}
            ) as response,
        ):
            return Answered(response.status, response.headers, await response.read())

    async def ledger_rows(self, count: int) -> list[Any]:
        """Every ledger row, ordered by time, once there are ``count`` (flushed as it waits)."""
        ledger = self.server.app[app_keys.LEDGER]
        rows: list[Any] = []

        async def enough() -> bool:
            nonlocal rows
            await ledger.flush()
            rows = await self.db.fetch("SELECT * FROM usage_events ORDER BY occurred_at")
            return len(rows) >= count

        await eventually(enough, what=f"{count} ledger rows")
        return rows

    async def hang_up_mid_stream(self, key: str) -> None:
        """Start a stream Venice stalls after one chunk, read that chunk, then close the socket."""
        self.fake.enqueue(Behaviour(stall_after_chunks=1))
        async with aiohttp.ClientSession() as session:
            response = await session.post(
                self.url("/v1/chat/completions"),
                json={
                    "model": "qwen3-5-9b",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                },
                headers={"Authorization": f"Bearer {key}"},
            )
            await response.content.readline()
            assert self.fake.active_streams == 1
            response.close()


@pytest.fixture
async def start_gateway(
    fake_venice: FakeVenice, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Any]:
    """Start a gateway with settings overrides: ``gateway = await start_gateway(upstream_max_retries=0)``;
    ``clocks``: what its own timing reads (a test's, to move instead of waiting)."""
    servers: list[TestServer] = []
    gateways: list[Gateway] = []

    async def start(clocks: Clocks = SYSTEM_CLOCKS, **overrides: Any) -> Gateway:
        settings = make_settings(fake_venice, database_url, **overrides)
        telemetry = make_telemetry(settings)
        app: web.Application = create_app(
            settings, database_url=database_url, telemetry=telemetry.telemetry, clocks=clocks
        )
        server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
        # Closed as ``serve`` closes it: a request still running after the grace is cancelled.
        await server.start_server(shutdown_timeout=settings.shutdown_grace_seconds)
        servers.append(server)
        gateways.append(Gateway(server, fake_venice, telemetry, db))
        return gateways[-1]

    yield start
    for gateway in gateways:
        await gateway.close_sdk_clients()
    for server in servers:
        await server.close()


@pytest.fixture
async def gateway(start_gateway: Any) -> Gateway:
    gateway: Gateway = await start_gateway()
    return gateway


@pytest.fixture
async def api_key(gateway: Gateway) -> str:
    return await gateway.create_key(name="default-test-key")


@pytest.fixture
async def empty_database(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A brand-new database with no schema, dropped after the test."""
    name = f"llmgw_empty_{uuid.uuid4().hex[:10]}"
    await _create_database(postgres_server.admin_url, name)
    yield with_database(postgres_server.admin_url, name)
    await _drop_database(postgres_server.admin_url, name)


@pytest.fixture
def api_key_for() -> Any:
    """Make a key on a gateway started with custom settings."""

    async def make(gateway: Gateway, **settings: Any) -> str:
        return await gateway.create_key(**settings)

    return make


# ---------------------------------------------------------------------------------------------
# Gateway processes with their JSON logs in files (replica, fault and fuzz tests), and the
# suite-wide scan for secrets in logs, spans, metrics and responses (tests/secrets_scan.py).

from tests.secrets_scan import SecretScanner  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def secret_scanner() -> Iterator[SecretScanner]:
    """Registers every key minted in this process and the fake Venice key; scans as the suite runs."""
    scanner = SecretScanner()
    scanner.register(FAKE_VENICE_KEY, "the fake Venice key")
    root = logging.getLogger()
    level = root.level
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)  # so billing records and warnings exist to be scanned
    root.addHandler(scanner.handler)
    with scanner.installed():
        yield scanner
    root.removeHandler(scanner.handler)
    root.setLevel(level)
    leaks = scanner.take_leaks()
    assert not leaks, "secrets leaked at the end of the run:\n" + "\n".join(sorted(set(leaks)))


@pytest.fixture(autouse=True)
def no_secret_leaks(secret_scanner: SecretScanner) -> Iterator[None]:
    """Fails the test during which a secret showed up anywhere the scanner looks."""
    root = logging.getLogger()
    if secret_scanner.handler not in root.handlers:
        root.addHandler(secret_scanner.handler)
    # Leaks seen after the previous test ended (its module's fixtures torn down) count here.
    earlier = secret_scanner.take_leaks()
    yield
    leaks = earlier + secret_scanner.take_leaks()
    if leaks:
        pytest.fail("secrets leaked:\n" + "\n".join(sorted(set(leaks))), pytrace=False)


@attrs.define
class GatewayProcess(LoopbackProcess):
    """A ``python -m llmgw serve`` process on a loopback port; its JSON log lines go to a file."""

    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def records(self) -> list[dict[str, Any]]:
        """Every log line, parsed; a line that is not JSON comes back as ``{"raw": line}``."""
        records: list[dict[str, Any]] = []
        # Split on "\n" only: JSON strings may hold U+2028, U+0085 and the like unescaped.
        for line in self.log_text().split("\n"):
            if not line:
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                record = None
            records.append(record if isinstance(record, dict) else {"raw": line})
        return records

    def billing_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == "llmgw.billing"]

    def watched(self, secret_scanner: Any, name: str) -> Iterator[GatewayProcess]:
        """A gateway shared by a module's tests, yielded to one of them; after it, the process is
        alive and its log has no new traceback or error line and no secret."""
        before = len(self.problems())
        yield self
        assert self.process.poll() is None, "the gateway process died"
        assert self.problems()[before:] == []
        secret_scanner.scan_text(self.log_text(), name)

    def problems(self, *allowed: str) -> list[str]:
        """Lines that are not JSON, carry a traceback, or are errors (minus ``allowed`` texts)."""
        found = []
        for record in self.records():
            line = record.get("raw") or orjson.dumps(record).decode()
            bad = (
                "raw" in record
                or "Traceback" in line
                or record.get("level") in ("error", "critical")
            )
            if bad and not any(text in line for text in allowed):
                found.append(line)
        return found

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.running() and answers_http(f"{self.url}/healthz"),
            within=timeout,
            what=f"the gateway on port {self.port} answers",
        )

    def running(self) -> bool:
        """True while the gateway runs; RuntimeError with the end of its log once it exited."""
        if self.process.poll() is not None:
            raise RuntimeError(
                f"gateway exited with {self.process.returncode}: {self.log_text()[-2000:]}"
            )
        return True

    def stop(self, timeout: float = 30.0) -> int:
        return stop(self.process, timeout=timeout)


def gateway_env(database_url: str, venice_base_url: str, **extra: str) -> dict[str, str]:
    """The environment of a gateway process for tests (external database, fake Venice)."""
    defaults = {
        "REQUEST_TIMEOUT_SECONDS": "5",
        "SHUTDOWN_GRACE_SECONDS": "10",
        "LLMGW_DATA_DIR": str(fresh_data_dir()),
    }
    return clean_env(
        DATABASE_URL=database_url,
        VENICE_API_KEY=FAKE_VENICE_KEY,
        VENICE_BASE_URL=venice_base_url,
        **{**defaults, **extra},
    )


def spawn_gateway(
    env: dict[str, str],
    log_path: Path,
    port: int,
    preexec_fn: Callable[[], None] | None = None,
) -> GatewayProcess:
    """Start a gateway process without waiting for it (see ``GatewayProcess.wait_ready``);
    ``preexec_fn`` runs in the child first (e.g. to lower its open files limit)."""
    with log_path.open("wb") as log:
        process = serve(
            env,
            port,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=preexec_fn,
        )
    return GatewayProcess(process, port, log_path)


@contextlib.contextmanager
def serving(env: dict[str, str], log_path: Path) -> Iterator[GatewayProcess]:
    """A gateway process a module's tests share: ready when entered, stopped cleanly on exit."""
    gateway = spawn_gateway(env, log_path, free_port())
    gateway.wait_ready()
    yield gateway
    assert gateway.stop() == 0


@pytest.fixture
def serve_in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, str]], int]]:
    """``llmgw serve``'s ``main`` in this process with only ``env`` as its environment (a process
    each is what the slow tests do); its exit status. Unless ``env`` names one, BIND_ADDR is a
    port in use: a configuration accepted by mistake ends in "cannot listen", never in a server."""
    previous = signal.getsignal(signal.SIGHUP)  # serve ignores SIGHUP until it serves
    taken = socket.create_server(("127.0.0.1", 0))

    def serve(env: dict[str, str]) -> int:
        env = {"BIND_ADDR": f"127.0.0.1:{taken.getsockname()[1]}", **env}
        for name in set(os.environ) - set(env):
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return main(["serve"])

    yield serve
    taken.close()
    signal.signal(signal.SIGHUP, previous)


StartGateways = Callable[..., list[GatewayProcess]]


@pytest.fixture
def gateway_processes(tmp_path: Path, secret_scanner: SecretScanner) -> Iterator[StartGateways]:
    """``start(env, count=1)`` starts gateway processes in parallel and waits until they answer.

    At teardown each is stopped with SIGTERM and its log is scanned for secrets.
    """
    started: list[GatewayProcess] = []

    def start(
        env: dict[str, str], count: int = 1, preexec_fn: Callable[[], None] | None = None
    ) -> list[GatewayProcess]:
        new = [
            spawn_gateway(
                env, tmp_path / f"gateway-{len(started) + index}.log", free_port(), preexec_fn
            )
            for index in range(count)
        ]
        started.extend(new)
        for gateway in new:
            gateway.wait_ready()
        return new

    yield start
    for gateway in started:
        gateway.stop()
    for gateway in started:
        secret_scanner.scan_text(
            gateway.log_text(), f"the log of the gateway on port {gateway.port}"
        )
