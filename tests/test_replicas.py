"""Three real gateway processes behind nginx (Debian's package), one shared Postgres.

Everything goes through nginx as production traffic would: the rate limit holds exactly across
replicas, a key revoked through one replica is refused by all within a second, streams are not
buffered, SIGTERM to a replica under load loses nothing, and a migration run while they serve
interrupts nothing. Without nginx these tests skip, or fail under CI=true (.ci/run installs it).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import attrs
import orjson
import pytest

from llmgw.storage import api_keys
from tests.conftest import GatewayProcess, StartGateways, gateway_env, spawn_gateway
from tests.fake_venice import Behaviour, FakeVenice
from tests.nginx import Nginx, require_nginx, start_nginx
from tests.processes import REPO_ROOT, clean_env, eventually, free_port, post_chat, wait_for_http

# A fleet of gateway processes behind nginx: pytest -m slow.
pytestmark = [pytest.mark.replicas, pytest.mark.slow]

REPLICAS = 3
ADMIN_TOKEN = "replica-test-admin-token-6d1f0c"
MESSAGES = [{"role": "user", "content": "hi"}]


@attrs.define
class Cluster:
    nginx: Nginx
    replicas: list[GatewayProcess]
    fake: FakeVenice
    env: dict[str, str]
    logs: Path
    # Every replica process started, restarted ones included: all their logs are checked...
    started: list[GatewayProcess] = attrs.Factory(list)
    # ...but those of restarts that exited before they were ready: the test failed with the log.
    failed: list[GatewayProcess] = attrs.Factory(list)

    @property
    def url(self) -> str:
        return self.nginx.url

    def restart(self, index: int) -> float:
        """SIGTERM replica ``index``, start it again on its port (as compose restarts a service:
        the port is free once the old process has exited); seconds until it is ready."""
        old = self.replicas[index]
        began = time.monotonic()
        assert old.stop() == 0, old.log_text()[-2000:]
        new = spawn_gateway(
            self.env, self.logs / f"replica-{index}-{len(self.started)}.log", old.port
        )
        self.started.append(new)
        self.replicas[index] = new
        try:
            new.wait_ready()
        except RuntimeError:  # it exited, and this error carries its log
            self.failed.append(new)
            raise
        wait_for_http(f"{new.url}/readyz", timeout=30)
        return time.monotonic() - began


@pytest.fixture
def make_cluster(
    gateway_processes: StartGateways,
    database_url: str,
    fake_venice: FakeVenice,
    tmp_path: Path,
    secret_scanner: Any,
) -> Iterator[Callable[[int], Cluster]]:
    """``make_cluster(count)``: that many replicas behind nginx running docker/nginx.conf."""
    require_nginx()
    secret_scanner.register(ADMIN_TOKEN, "the admin token")
    clusters: list[Cluster] = []

    def make(count: int) -> Cluster:
        env = gateway_env(database_url, fake_venice.base_url, LLMGW_ADMIN_TOKEN=ADMIN_TOKEN)
        replicas = gateway_processes(env, count=count)
        nginx = start_nginx(tmp_path / "nginx", free_port(), [r.port for r in replicas])
        cluster = Cluster(nginx, replicas, fake_venice, env, tmp_path, list(replicas))
        clusters.append(cluster)
        return cluster

    yield make
    # Every process stopped first (those already gone too), whatever a log holds: none is left
    # running past the test.
    for cluster in clusters:
        cluster.nginx.stop()
        for replica in cluster.started:
            replica.stop()
    for cluster in clusters:
        for replica in cluster.started:
            secret_scanner.scan_text(replica.log_text(), f"the log of replica {replica.port}")
        problems = {r.port: r.problems() for r in cluster.started if r not in cluster.failed}
        assert all(found == [] for found in problems.values()), problems


@pytest.fixture
def cluster(make_cluster: Callable[[int], Cluster]) -> Cluster:
    return make_cluster(REPLICAS)


async def new_key(db: asyncpg.Connection, limit: int = 100_000) -> api_keys.IssuedKey:
    return await api_keys.create_key(
        db, api_keys.KeySettings(name="replicas", rate_limit_requests=limit)
    )


@attrs.frozen
class Answer:
    status: int
    body: bytes
    request_id: str
    started: float
    ended: float

    @property
    def complete(self) -> bool:
        """A 200 whose stream (if it is one) ran to [DONE] without an error event."""
        if self.status != 200:
            return False
        if self.body.startswith(b"data: "):
            return self.body.rstrip().endswith(b"data: [DONE]") and b'{"error"' not in self.body
        return b'"choices"' in self.body


async def chat(
    session: aiohttp.ClientSession, base: str, key: str, *, stream: bool = False
) -> Answer:
    started = time.time()
    status, body, request_id = await post_chat(session, base, key, stream=stream, timeout=30)
    return Answer(status, body, request_id, started, time.time())


def _completions(fake: FakeVenice) -> list[Any]:
    """What Venice was asked, less the model listing each replica makes at start."""
    return [request for request in fake.received if request.path != "/api/v1/models"]


def served_by(cluster: Cluster) -> dict[str, str]:
    """Request id -> the replica port nginx got the answer from (the last one it tried)."""
    return {
        entry["rid"]: entry["upstream"].split(",")[-1].strip().rsplit(":", 1)[-1]
        for entry in cluster.nginx.access_entries()
    }


async def test_one_keys_limit_is_exact_across_replicas(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    limit, extra = 12, 18
    issued = await new_key(db, limit)
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(
            *(chat(session, cluster.url, issued.plaintext) for _ in range(limit + extra))
        )
    assert sorted(a.status for a in answers) == [200] * limit + [429] * extra
    for answer in answers:
        if answer.status == 429:
            assert orjson.loads(answer.body)["error"]["code"] == "rate_limit_exceeded"
    ports = set(served_by(cluster).values())
    assert ports == {str(r.port) for r in cluster.replicas}, "nginx spread the load"


async def test_key_revoked_through_one_replica_is_refused_by_all_within_a_second(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    issued = await new_key(db)
    key = issued.plaintext
    async with aiohttp.ClientSession() as session:
        # Every replica has authenticated (and cached) the key.
        for replica in cluster.replicas:
            assert (await chat(session, replica.url, key)).status == 200
        async with session.post(
            f"{cluster.replicas[0].url}/admin/v1/keys/{issued.record.id}/revoke",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response:
            assert response.status == 200, await response.read()
        revoked_at = time.monotonic()
        refused_after: dict[str, float] = {}
        bases = [r.url for r in cluster.replicas] + [cluster.url]

        async def refused_by_all() -> bool:
            for base in bases:
                if base not in refused_after and (await chat(session, base, key)).status == 401:
                    refused_after[base] = time.monotonic() - revoked_at
            return len(refused_after) == len(bases)

        await eventually(refused_by_all, within=1.0, what="every replica refuses it", every=0.01)
    print(f"revocation seen by every replica after {max(refused_after.values()) * 1000:.0f} ms")


async def test_streams_pass_through_nginx_unbuffered(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    issued = await new_key(db)
    cluster.fake.enqueue(Behaviour(chunk_delay=0.3))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{cluster.url}/v1/chat/completions",
            json={"model": "qwen3-5-9b", "messages": MESSAGES, "stream": True},
            headers={"Authorization": f"Bearer {issued.plaintext}"},
        ) as response,
    ):
        assert response.status == 200
        started = time.monotonic()
        first = b""
        while b'"content":"H' not in first:
            first += await response.content.readline()
        first_at = time.monotonic() - started
        assert cluster.fake.active_streams == 1, "Venice is still generating"
        rest = await response.read()
        ended_at = time.monotonic() - started
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert first_at < 0.5 < ended_at - 1.0, (first_at, ended_at)


async def test_sigterm_to_a_replica_under_load_loses_no_request(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    issued = await new_key(db)
    key = issued.plaintext
    victim = cluster.replicas[0]
    answers: list[Answer] = []
    # Three slow streams, then three slow plain requests: nginx's round robin gives every replica
    # (the victim too) one of each, all still waiting on Venice at SIGTERM. The load is quick.
    cluster.fake.enqueue(*[Behaviour(delay_before_headers=0.8, chunk_delay=0.1)] * 6)
    cluster.fake.default_behaviour = Behaviour(chunk_delay=0.01)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        pinned = []
        for stream in (True, True, True, False, False, False):
            pinned.append(asyncio.create_task(chat(session, cluster.url, key, stream=stream)))
            count = len(pinned)
            await eventually(lambda n=count: len(_completions(cluster.fake)) >= n, within=2.5)
        assert len(_completions(cluster.fake)) == 6

        stop_load = asyncio.Event()

        async def load(worker: int) -> None:
            while not stop_load.is_set():
                answers.append(await chat(session, cluster.url, key, stream=worker % 2 == 0))

        workers = [asyncio.create_task(load(i)) for i in range(8)]
        await eventually(lambda: len(answers) >= 8, within=10, what="the load is answered")
        sigterm_at = time.time()
        victim.process.send_signal(signal.SIGTERM)
        # The moment it stops listening, which a busy machine may delay past the signal.
        closed_at = await asyncio.to_thread(_refused_after, victim.port)

        def started_after_it_closed() -> list[Answer]:
            return [a for a in answers if a.started > closed_at + 0.05]

        await eventually(
            lambda: len(started_after_it_closed()) > 50, within=15, what="answers after it closed"
        )
        stop_load.set()
        answers.extend(await asyncio.gather(*pinned))
        await asyncio.gather(*workers)

    failed = [(a.status, a.body[-300:]) for a in answers if not a.complete]
    assert failed == [], "a client saw an error"
    assert await asyncio.to_thread(victim.process.wait, 15) == 0
    # The victim finished what it had in flight (a stream and a plain request at least)...
    finished_late = [r for r in victim.billing_records() if r["outcome"] == "completed"]
    finished_late = [r for r in finished_late if _epoch(r["timestamp"]) > sigterm_at]
    assert {r["stream"] for r in finished_late} == {True, False}, finished_late
    # ...and nginx sent every request that came after it closed its port to the other replicas
    # (also those it had sent on a pooled connection the victim closed instead of reading).
    replica_of = served_by(cluster)
    late = started_after_it_closed()
    assert len(late) > 50
    assert all(replica_of[a.request_id] != str(victim.port) for a in late)
    print(f"{len(answers)} requests, none failed; {len(late)} started after SIGTERM")


async def test_rolling_restart_under_load_fails_no_request(
    make_cluster: Callable[[int], Cluster], db: asyncpg.Connection
) -> None:
    """Compose's two replicas, restarted one after the other, each as soon as the previous one is
    ready again, while clients keep calling through nginx: no 5xx, no connection error."""
    cluster = make_cluster(2)
    issued = await new_key(db)
    cluster.fake.default_behaviour = Behaviour(chunk_delay=0.01)
    answers: list[Answer] = []
    errors: list[str] = []
    stop_load = asyncio.Event()

    async def load(session: aiohttp.ClientSession, worker: int) -> None:
        while not stop_load.is_set():
            try:
                answers.append(
                    await chat(session, cluster.url, issued.plaintext, stream=worker % 2 == 0)
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors.append(repr(exc))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        workers = [asyncio.create_task(load(session, i)) for i in range(8)]
        try:
            await eventually(lambda: len(answers) >= 8, within=10, what="the load is answered")
            restarted_at = []
            took = []
            for index in range(len(cluster.replicas)):
                restarted_at.append(time.time())
                took.append(await asyncio.to_thread(cluster.restart, index))
            finished_at = time.time()

            def back_in_service(index: int) -> bool:
                """Whether the restarted replica ``index`` answered a request started once it
                was ready again."""
                replica_of, port = served_by(cluster), str(cluster.replicas[index].port)
                since = restarted_at[index] + took[index]
                return any(
                    replica_of.get(a.request_id) == port for a in answers if a.started > since
                )

            await eventually(
                lambda: all(back_in_service(i) for i in range(len(cluster.replicas))),
                within=10,
                every=0.1,
                what="each restarted replica takes traffic again",
            )
        finally:  # the load ends with the test, failed or not: no task outlives its session
            stop_load.set()
            await asyncio.gather(*workers)

    failed = [(a.status, a.body[-200:]) for a in answers if not a.complete]
    during = [a for a in answers if restarted_at[0] <= a.started <= finished_at]
    print(
        f"rolling restart of {len(took)} replicas ({', '.join(f'{t:.1f} s' for t in took)}): "
        f"{len(answers)} requests, {len(during)} during the restarts, {len(failed)} failed, "
        f"{len(errors)} connection errors"
    )
    assert errors == [], errors[:5]
    assert failed == [], failed[:5]
    assert len(during) > 50, "the load kept going through the restarts"


def test_a_restart_on_a_taken_port_fails_with_its_log_and_only_once(
    make_cluster: Callable[[int], Cluster],
) -> None:
    """What CI saw (issue 29): the restarted replica cannot listen. The test fails with the
    replica's log, and the teardown, which stops the rest, does not fail a second time for it."""
    cluster = make_cluster(2)
    port = cluster.replicas[0].port
    assert cluster.replicas[0].stop() == 0
    with socket.socket() as taker:
        # As the replica binds: its connections' TIME_WAIT does not keep the port.
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker.bind(("127.0.0.1", port))
        taker.listen()
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}"):
            cluster.restart(0)
    assert cluster.failed == [cluster.replicas[0]]


def _refused_after(port: int, within: float = 10.0) -> float:
    """The time at which connecting to ``port`` on loopback is first refused."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return time.time()
        time.sleep(0.005)
    raise TimeoutError(f"port {port} still accepts connections after {within} s")


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()


async def test_migrating_while_replicas_serve_interrupts_nothing(
    cluster: Cluster, db: asyncpg.Connection, database_url: str
) -> None:
    issued = await new_key(db)
    env = clean_env(DATABASE_URL=database_url)
    commands = [
        [sys.executable, "-m", "alembic", "upgrade", "head"],  # from the checkout
        [sys.executable, "-m", "llmgw", "db", "upgrade"],  # from the installed package
    ]
    answers: list[Answer] = []
    async with aiohttp.ClientSession() as session:
        stop_load = asyncio.Event()

        async def load(worker: int) -> None:
            while not stop_load.is_set():
                answers.append(
                    await chat(session, cluster.url, issued.plaintext, stream=worker % 2 == 0)
                )

        workers = [asyncio.create_task(load(i)) for i in range(6)]
        for command in commands:
            result = await asyncio.to_thread(
                subprocess.run, command, cwd=REPO_ROOT, env=env, capture_output=True, text=True
            )
            assert result.returncode == 0, result.stderr
        stop_load.set()
        await asyncio.gather(*workers)
    assert len(answers) > 10
    assert [a.status for a in answers if not a.complete] == []
    for replica in cluster.replicas:
        assert replica.process.poll() is None
