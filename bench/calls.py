"""Python calls per request: a count that does not move with the machine's load.

``python -m bench.calls --database-url postgresql://...`` runs ``llmgw serve`` as the benchmark
does (every span and metric exported to a sink, the billing line logged), under ``cProfile``
switched on only while measured requests run, and prints the function calls the gateway's main
thread made per request, non-streamed and streamed, with the functions that made the most.
CPU time on a shared machine moves by 20% between runs; this count moves by a few calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

from bench.lab import CHUNKS, PROVIDER_KEY, REPO_ROOT, SetupError
from bench.load import LoadSpec, run_load
from bench.services import (
    Child,
    Pinning,
    free_port,
    spawn,
    wait_for_health,
    wait_for_listening,
)

# Runs the gateway's CLI with a profiler SIGUSR1 starts and SIGUSR2 stops and writes out.
_PROFILED = """
import cProfile, signal, sys
profile = cProfile.Profile()
def start(*_): profile.enable()
def stop(*_):
    profile.disable()
    profile.dump_stats(sys.argv[1])
    profile.clear()
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
from llmgw.cli import main
sys.exit(main(["serve"]))
"""


@contextlib.contextmanager
def _scratch_database(admin_url: str) -> Iterator[str]:
    name = f"llmgw_calls_{uuid.uuid4().hex[:8]}"

    async def run(statement: str) -> None:
        connection = await asyncpg.connect(admin_url)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
    finally:
        asyncio.run(run(f'DROP DATABASE "{name}" WITH (FORCE)'))


def _create_key(env: dict[str, str]) -> str:
    completed = subprocess.run(
        [sys.executable, "-m", "llmgw", "keys", "create", "--name", "calls",
         "--rate-limit-requests", "100000000", "--rate-limit-window-seconds", "60", "--json"],
        env=env, cwd=REPO_ROOT, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise SetupError(f"llmgw keys create failed:\n{completed.stderr.decode()[-2000:]}")
    key: str = orjson.loads(completed.stdout.splitlines()[-1])["key"]
    return key


def _measure(
    gateway: Child,
    url: str,
    token: str,
    *,
    stream: bool,
    requests: int,
    concurrency: int,
    out: Path,
) -> pstats.Stats:
    spec = LoadSpec(url=url, token=token, stream=stream, concurrency=concurrency, requests=200)
    asyncio.run(run_load(spec))  # warm: connections, caches, the key
    os.kill(gateway.pid, signal.SIGUSR1)
    time.sleep(0.2)
    load = asyncio.run(
        run_load(LoadSpec(url=url, token=token, stream=stream, concurrency=concurrency,
                          requests=requests))
    )  # fmt: skip
    if load.errors:
        raise SetupError(f"{load.errors} requests failed: {load.error_samples}")
    os.kill(gateway.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not out.exists() or out.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise SetupError("the gateway wrote no profile")
        time.sleep(0.05)
    time.sleep(0.2)
    stats = pstats.Stats(str(out))
    out.rename(out.with_name(f"profile-{'stream' if stream else 'json'}"))
    return stats


def _report(name: str, stats: pstats.Stats, requests: int, top: int) -> None:
    total = sum(calls for _, calls, _, _, _ in stats.stats.values())  # type: ignore[attr-defined]
    print(f"{name}: {total / requests:.1f} Python calls per request ({requests} requests)")
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: -item[1][1],
    )[:top]
    for (file, line, function), (_, calls, _, _, _) in rows:
        where = file.replace(str(REPO_ROOT) + "/", "").split("site-packages/")[-1]
        print(f"  {calls / requests:7.2f}  {where}:{line} {function}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", required=True, help="a server to make a scratch database on"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="the gateway's, and the fake's and the sink's the two after it (default: any free)",
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--keep", type=Path, default=None, help="a directory to copy the profiles to"
    )
    parser.add_argument("--only", choices=("json", "stream"), default=None)
    args = parser.parse_args(argv)
    pinning = Pinning.detect()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmgw-calls-")))
        database_url = stack.enter_context(_scratch_database(args.database_url))
        base_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT)}
        upstream = spawn(
            "upstream",
            [sys.executable, "tests/fake_venice.py", "--port", str(args.port and args.port + 1),
             "--chunks", str(CHUNKS)],
            env=base_env, log_dir=tmp, pinning=pinning, core=pinning.rest_core, cwd=REPO_ROOT,
        )  # fmt: skip
        stack.callback(upstream.stop)
        sink = spawn(
            "sink",
            [sys.executable, "bench/otlp_sink.py", "--port", str(args.port and args.port + 2)],
            env=base_env, log_dir=tmp, pinning=pinning, core=pinning.rest_core, cwd=REPO_ROOT,
        )  # fmt: skip
        stack.callback(sink.stop)
        upstream_url, sink_url = wait_for_listening(upstream), wait_for_listening(sink)
        env = {**base_env, "DATABASE_URL": database_url}
        token = _create_key({**env, "LLMGW_AUTO_MIGRATE": "true"})
        port = args.port or free_port()
        out = tmp / "profile"
        gateway = spawn(
            "gateway",
            [sys.executable, "-c", _PROFILED, str(out)],
            env={
                **env,
                "BIND_ADDR": f"127.0.0.1:{port}",
                "VENICE_API_KEY": PROVIDER_KEY,
                "VENICE_BASE_URL": upstream_url,
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink_url,
                "SHUTDOWN_GRACE_SECONDS": "2",
            },
            log_dir=tmp, pinning=pinning, core=pinning.proxy_core, cwd=REPO_ROOT,
        )  # fmt: skip
        stack.callback(gateway.stop)
        base = f"http://127.0.0.1:{port}"
        wait_for_health(gateway, base + "/healthz")
        for stream in (False, True):
            if args.only is not None and args.only != ("stream" if stream else "json"):
                continue
            stats = _measure(
                gateway, base + "/v1/chat/completions", token, stream=stream,
                requests=args.requests, concurrency=args.concurrency, out=out,
            )  # fmt: skip
            _report("streamed" if stream else "non-streamed", stats, args.requests, args.top)
            if args.keep is not None:
                kind = "stream" if stream else "json"
                os.replace(tmp / f"profile-{kind}", args.keep / f"profile-{kind}")


if __name__ == "__main__":
    main()
