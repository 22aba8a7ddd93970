"""serve's lifecycle with real processes: exact timeouts, a bounded stop whatever the collector does,
half-closed clients, SIGHUP reload, and an embedded cluster that outlives a killed process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from llmgw.storage import api_keys
from tests.conftest import GatewayProcess, StartGateways, gateway_env, spawn_gateway
from tests.fake_venice import Behaviour, FakeVenice
from tests.processes import clean_env, eventually, free_port, wait_until

MESSAGES = [{"role": "user", "content": "hi"}]
BODY = {"model": "qwen3-5-9b", "messages": MESSAGES}


async def new_key(db: asyncpg.Connection, **settings: Any) -> str:
    issued = await api_keys.create_key(db, api_keys.KeySettings(name="lifecycle", **settings))
    return issued.plaintext


async def timed_chat(base: str, key: str, body: dict[str, Any]) -> tuple[int, float]:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response,
    ):
        await response.read()
        return response.status, time.monotonic() - started


async def wait_for_log(gateway: GatewayProcess, text: str) -> None:
    await eventually(lambda: text in gateway.log_text(), within=10, what=f"a log line {text!r}")


# ---------------------------------------------------------------------------------------------
# Timeouts


@pytest.mark.slow
async def test_upstream_timeout_of_5s_is_met_within_10_percent(
    gateway_processes: StartGateways, database_url: str, fake_venice: FakeVenice, db: Any
) -> None:
    # 5 s is where aiohttp starts rounding timeouts up to a whole second of loop time.
    fake_venice.default_behaviour = Behaviour(delay_before_headers=30)
    fake_venice.enqueue(Behaviour(status=503))  # one retry first: it must not add time
    (gateway,) = gateway_processes(
        gateway_env(database_url, fake_venice.base_url, REQUEST_TIMEOUT_SECONDS="5")
    )
    key = await new_key(db)
    results = await asyncio.gather(
        timed_chat(gateway.url, key, BODY),
        timed_chat(gateway.url, key, {**BODY, "stream": True}),
        timed_chat(gateway.url, key, BODY),
    )
    for status, elapsed in results:
        assert status == 504
        assert 4.9 <= elapsed <= 5.5, results


# ---------------------------------------------------------------------------------------------
# Shutdown


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """An OTLP endpoint that accepts connections and never answers (nobody calls accept())."""
    with socket.create_server(("127.0.0.1", 0), backlog=128) as sock:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.slow
async def test_sigterm_exits_within_the_grace_whatever_the_collector_does(
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    db: Any,
    silent_collector: str,
) -> None:
    grace = 2.0
    env = gateway_env(
        database_url,
        fake_venice.base_url,
        SHUTDOWN_GRACE_SECONDS=str(grace),
        OTEL_EXPORTER_OTLP_ENDPOINT=silent_collector,
    )
    (gateway,) = gateway_processes(env)
    status, _ = await timed_chat(gateway.url, await new_key(db), BODY)
    assert status == 200  # spans and metrics are waiting for the collector
    started = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(gateway.process.wait, grace + 20)
    except subprocess.TimeoutExpired:
        code = None
    elapsed = time.monotonic() - started
    assert code == 0 and elapsed < grace + 6, (code, elapsed)
    assert "telemetry export did not finish" in gateway.log_text()


# ---------------------------------------------------------------------------------------------
# Half-closed clients


async def half_closed_exchange(gateway: GatewayProcess, key: str) -> bytes:
    """Send one request, shut down the write side (``shutdown(SHUT_WR)``), read to the end."""
    body = orjson.dumps(BODY)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        b"\r\n" + body
    )
    await writer.drain()
    writer.write_eof()
    try:
        return await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()


async def test_half_closed_client_is_a_client_that_left(
    gateway_processes: StartGateways, database_url: str, fake_venice: FakeVenice, db: Any
) -> None:
    # Its FIN closes the connection (aiohttp's behaviour; lifecycle/runner.py says why llmgw no
    # longer keeps it open): no answer, no error, and the gateway serves on.
    (gateway,) = gateway_processes(gateway_env(database_url, fake_venice.base_url))
    key = await new_key(db)
    assert await half_closed_exchange(gateway, key) == b""
    status, _ = await timed_chat(gateway.url, key, BODY)
    assert status == 200
    assert "Traceback" not in gateway.log_text()


# ---------------------------------------------------------------------------------------------
# SIGHUP


def providers_file(path: Path, base_url: str) -> None:
    path.write_text(
        "[[providers]]\n"
        'name = "up"\nkind = "openai-compatible"\n'
        f'base_url = "{base_url}"\napi_key_env = "VENICE_API_KEY"\n\n'
        '[[models]]\nalias = "fast"\ndeployments = ["up:qwen3-5-9b"]\n'
    )


@pytest.mark.slow
async def test_sighup_rereads_the_config_without_dropping_a_request(
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    db: Any,
    tmp_path: Path,
) -> None:
    config = tmp_path / "llmgw.toml"
    providers_file(config, fake_venice.base_url)
    env = gateway_env(database_url, fake_venice.base_url, LLMGW_CONFIG=str(config))
    (gateway,) = gateway_processes(env)
    key = await new_key(db)
    fast = {"model": "fast", "messages": MESSAGES}
    async with FakeVenice() as replacement, aiohttp.ClientSession() as session:
        fake_venice.enqueue(Behaviour(chunk_delay=0.3))
        async with session.post(
            f"{gateway.url}/v1/chat/completions",
            json={**fast, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        ) as in_flight:
            assert in_flight.status == 200
            await in_flight.content.readline()
            providers_file(config, replacement.base_url)
            gateway.process.send_signal(signal.SIGHUP)
            await wait_for_log(gateway, "configuration reloaded")
            status, _ = await timed_chat(gateway.url, key, fast)
            assert status == 200
            assert len(replacement.received) == 1, "new requests use the new provider"
            streamed = await in_flight.read()
        assert streamed.rstrip().endswith(b"data: [DONE]"), "the old provider finished its stream"
        assert fake_venice.completed_streams == 1

        config.write_text("[[providers]]\nname = 'broken\n")
        gateway.process.send_signal(signal.SIGHUP)
        await wait_for_log(gateway, "configuration reload failed")
        status, _ = await timed_chat(gateway.url, key, fast)
        assert status == 200
        assert len(replacement.received) == 2, "an invalid file keeps the running configuration"
    assert gateway.process.poll() is None
    assert gateway.problems("configuration reload failed") == []


BAD_RELOADS = [
    # (what the file gets instead of a good provider entry's last line, the reason logged)
    (
        'headers = { "X-Org" = "org-1\\r\\nX-Injected: yes" }',
        "providers[0].headers.X-Org: expected a header value without control characters",
    ),
    (
        'base_url = "http://user:reload-password@127.0.0.1:9/v1"',
        "providers[0].base_url: holds credentials (user:password@); give the key through "
        "api_key_env or headers",
    ),
    (
        "input_usd_per_mtok = 1e308\noutput_usd_per_mtok = 1",
        "providers[0].input_usd_per_mtok: expected a price of 0 to 10000 USD per million tokens",
    ),
]


@pytest.mark.slow
async def test_sighup_keeps_the_running_configuration_when_a_header_url_or_price_is_refused(
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    db: Any,
    tmp_path: Path,
) -> None:
    config = tmp_path / "llmgw.toml"
    providers_file(config, fake_venice.base_url)
    good = config.read_text()
    env = gateway_env(database_url, fake_venice.base_url, LLMGW_CONFIG=str(config))
    (gateway,) = gateway_processes(env)
    key = await new_key(db)
    fast = {"model": "fast", "messages": MESSAGES}
    for line, reason in BAD_RELOADS:
        # A later key wins in TOML only by error, so the entry's base_url line is replaced whole.
        bad = good.replace(
            'api_key_env = "VENICE_API_KEY"', f'api_key_env = "VENICE_API_KEY"\n{line}'
        )
        if line.startswith("base_url"):
            bad = "\n".join(
                row
                for row in bad.splitlines()
                if not row.startswith(f'base_url = "{fake_venice.base_url}')
            )
        config.write_text(bad)
        gateway.process.send_signal(signal.SIGHUP)
        await wait_for_log(gateway, reason)
        status, _ = await timed_chat(gateway.url, key, fast)
        assert status == 200, f"the running configuration stays after {line!r}"
    chats = [r for r in fake_venice.received if r.path.endswith("/chat/completions")]
    assert len(chats) == len(BAD_RELOADS)
    reloads = [
        r for r in gateway.records() if "configuration reload failed" in r.get("message", "")
    ]
    assert len(reloads) == len(BAD_RELOADS)
    assert "reload-password" not in gateway.log_text()
    assert gateway.process.poll() is None


@pytest.mark.slow
async def test_the_start_line_shows_no_credential_of_a_provider_url(
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    tmp_path: Path,
) -> None:
    config = tmp_path / "llmgw.toml"
    providers_file(config, f"{fake_venice.base_url}?key=query-secret-value&region=eu")
    env = gateway_env(database_url, fake_venice.base_url, LLMGW_CONFIG=str(config))
    (gateway,) = gateway_processes(env)
    await wait_for_log(gateway, "llmgw listening on")
    (line,) = [
        r["message"] for r in gateway.records() if "llmgw listening on" in r.get("message", "")
    ]
    assert f"up at {fake_venice.base_url}?key=***&region=***" in line
    assert "query-secret-value" not in gateway.log_text()


# ---------------------------------------------------------------------------------------------
# The embedded cluster


def postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


@pytest.fixture
def embedded_data_dir(tmp_path: Path) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    os.chmod(tmp_path, 0o755)  # the embedded server runs as its own user when we are root
    yield data_dir
    pid = postmaster_pid(data_dir / "postgres")
    if pid is not None:  # the test failed: do not leave its cluster running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)


@pytest.mark.slow  # an embedded PostgreSQL and three processes
def test_the_last_live_process_stops_the_cluster_after_one_was_killed(
    embedded_data_dir: Path, tmp_path: Path, fake_venice: FakeVenice
) -> None:
    env = clean_env(
        VENICE_API_KEY="unused",
        VENICE_BASE_URL=fake_venice.base_url,
        LLMGW_DATA_DIR=str(embedded_data_dir),
    )
    pgdata = embedded_data_dir / "postgres"
    killed = spawn_gateway(env, tmp_path / "killed.log", free_port())
    killed.wait_ready(timeout=120)
    killed.process.kill()
    killed.process.wait()
    assert postmaster_pid(pgdata) is not None, "the cluster outlives a killed process"
    assert killed.process.pid in orjson.loads((pgdata / ".handle_pids.json").read_bytes())

    last = spawn_gateway(env, tmp_path / "last.log", free_port())
    last.wait_ready(timeout=120)
    assert last.stop() == 0
    wait_until(
        lambda: postmaster_pid(pgdata) is None,
        within=20,
        what="the last live process stops the cluster",
    )
