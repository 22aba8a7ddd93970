"""Work per request in counts that do not move with the machine's load.

``python -m bench.calls --database-url postgresql://...`` runs ``llmgw serve`` as the benchmark
does (every span and metric exported to a sink, the billing line logged) and counts, while
measured requests run, non-streamed and then streamed:

- by default, the Python function calls of the gateway's main thread (``cProfile``), with the
  functions that made the most;
- with ``--cache``, the same with ``LLMGW_CACHE=memory``: every measured request is a cache hit
  (the warm-up's first request stores the answer);
- with ``--callgrind``, the instructions the whole gateway process executed, every thread and
  C code included (``valgrind --tool=callgrind``; about 50 times slower, so use a low
  ``--concurrency`` and a few hundred requests);
- with ``--callgrind --floor``, the instructions of ``bench/floor_proxy.py`` passing the same
  requests through: what a ``--cache`` hit is held to (issue 30), in counts the load of a shared
  machine does not move;
- with ``--callgrind --floor --cache``, the floor answering repeats from a dict: the least an
  aiohttp server can spend on a cache hit (what is left of the pass-through's count for all of a
  gateway's own work on one).

CPU time on a shared machine moves by 20% between runs; these counts move by a few per cent at
most. ``--llmgw-src`` measures another source tree (an exported commit), for a before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

from bench import cache
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

__all__ = ["main"]

_WARM_REQUESTS = 200

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
_CALLGRIND_TOTAL = re.compile(rb"^(?:totals|summary): (\d+)", re.MULTILINE)


class _Counter(Protocol):
    def argv(self) -> list[str]: ...

    def start(self, pid: int) -> None: ...

    def stop(self, pid: int, name: str, requests: int) -> None:
        """Stops counting and prints what was counted per request."""


class _Calls:
    """Python calls of the main thread, by function."""

    def __init__(self, out: Path, top: int, keep: Path | None) -> None:
        self._out, self._top, self._keep = out, top, keep

    def argv(self) -> list[str]:
        return [sys.executable, "-c", _PROFILED, str(self._out)]

    def start(self, pid: int) -> None:
        os.kill(pid, signal.SIGUSR1)

    def stop(self, pid: int, name: str, requests: int) -> None:
        os.kill(pid, signal.SIGUSR2)
        _wait_for_file(self._out)
        stats = pstats.Stats(str(self._out))
        if self._keep is not None:
            os.replace(self._out, self._keep / f"profile-{name}")
        else:
            self._out.unlink()
        rows = stats.stats.items()  # type: ignore[attr-defined]
        total = sum(calls for _, (_, calls, _, _, _) in rows)
        print(f"{name}: {total / requests:.1f} Python calls per request ({requests} requests)")
        for (file, line, function), (_, calls, _, _, _) in sorted(rows, key=lambda r: -r[1][1])[
            : self._top
        ]:
            where = file.replace(str(REPO_ROOT) + "/", "").split("site-packages/")[-1]
            print(f"  {calls / requests:7.2f}  {where}:{line} {function}")


class _Instructions:
    """Instructions of the whole process (callgrind), counted only while switched on."""

    def __init__(self, tmp: Path, keep: Path | None, program: Sequence[str]) -> None:
        self._tmp, self._keep, self._program = tmp, keep, program

    def argv(self) -> list[str]:
        return [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={self._tmp}/callgrind.%p",
            sys.executable, *self._program,
        ]  # fmt: skip

    def start(self, pid: int) -> None:
        _control("-z", pid)  # what the warm-up counted (nothing: instrumentation was off)
        _control("-i", "on", pid)

    def stop(self, pid: int, name: str, requests: int) -> None:
        _control("-d", name, pid)  # dumped: everything since the -z
        _control("-i", "off", pid)
        dumps = sorted(self._tmp.glob(f"callgrind.{pid}.*"), key=lambda p: p.stat().st_mtime)
        if not dumps:
            raise SetupError("callgrind wrote no dump")
        match = _CALLGRIND_TOTAL.search(dumps[-1].read_bytes())
        if match is None:
            raise SetupError(f"no total in {dumps[-1]}")
        total = int(match.group(1))
        if self._keep is not None:  # for callgrind_annotate
            os.replace(dumps[-1], self._keep / f"callgrind-{name}")
        else:
            dumps[-1].unlink()
        print(
            f"{name}: {total / requests / 1e6:.3f} M instructions per request ({requests} requests)"
        )


def _control(*args: str | int) -> None:
    subprocess.run(
        ["callgrind_control", *map(str, args)], check=True, capture_output=True, timeout=120
    )


def _wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() or path.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise SetupError(f"the gateway wrote no {path.name}")
        time.sleep(0.05)
    time.sleep(0.2)  # written whole


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


def _create_key(env: dict[str, str], src: Path) -> str:
    completed = subprocess.run(
        [sys.executable, "-m", "llmgw", "keys", "create", "--name", "calls",
         "--rate-limit-requests", "100000000", "--rate-limit-window-seconds", "60", "--json"],
        env=env, cwd=src, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise SetupError(f"llmgw keys create failed:\n{completed.stderr.decode()[-2000:]}")
    key: str = orjson.loads(completed.stdout.splitlines()[-1])["key"]
    return key


def _measure(
    counter: _Counter, gateway: Child, url: str, token: str, args: argparse.Namespace, stream: bool
) -> None:
    def load(requests: int) -> None:
        spec = LoadSpec(
            url=url, token=token, stream=stream, concurrency=args.concurrency, requests=requests
        )
        result = asyncio.run(run_load(spec))
        if result.errors:
            raise SetupError(f"{result.errors} requests failed: {result.error_samples}")

    load(_WARM_REQUESTS)  # connections, caches, the key
    counter.start(gateway.pid)
    time.sleep(0.2)
    load(args.requests)
    counter.stop(gateway.pid, "stream" if stream else "json", args.requests)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
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
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument(
        "--cache",
        action="store_true",
        help="LLMGW_CACHE=memory (with --floor: the floor's dict): every measured request a hit",
    )
    parser.add_argument(
        "--floor", action="store_true", help="count bench/floor_proxy.py instead (--callgrind)"
    )
    parser.add_argument("--top", type=int, default=40, help="functions listed (calls)")
    parser.add_argument(
        "--keep", type=Path, default=None, help="a directory for the profiles or dumps"
    )
    parser.add_argument("--only", choices=("json", "stream"), default=None)
    parser.add_argument("--llmgw-src", type=Path, default=REPO_ROOT, help="the tree to run")
    args = parser.parse_args(argv)
    if args.floor and not args.callgrind:
        parser.error("--floor counts instructions: add --callgrind")
    pinning = Pinning.detect()
    src = args.llmgw_src.resolve()
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
        port = args.port or free_port()
        counter: _Counter
        if args.floor:
            counter = _Instructions(
                tmp, args.keep, _floor_program(port, upstream_url, cache=args.cache)
            )
            proxy = spawn(
                "floor", counter.argv(),
                env=base_env, log_dir=tmp, pinning=pinning, core=pinning.proxy_core, cwd=REPO_ROOT,
            )  # fmt: skip
            stack.callback(proxy.stop)
            wait_for_listening(proxy, timeout=300)
            token = PROVIDER_KEY  # the floor checks no key
        else:
            env = {
                "PATH": os.environ["PATH"], "PYTHONPATH": str(src), "DATABASE_URL": database_url
            }  # fmt: skip
            token = _create_key({**env, "LLMGW_AUTO_MIGRATE": "true"}, src)
            counter = (
                _Instructions(tmp, args.keep, ("-m", "llmgw", "serve"))
                if args.callgrind
                else _Calls(tmp / "profile", args.top, args.keep)
            )
            proxy = spawn(
                "gateway",
                counter.argv(),
                env={
                    **env,
                    "BIND_ADDR": f"127.0.0.1:{port}",
                    "VENICE_API_KEY": PROVIDER_KEY,
                    "VENICE_BASE_URL": upstream_url,
                    "OTEL_EXPORTER_OTLP_ENDPOINT": sink_url,
                    "SHUTDOWN_GRACE_SECONDS": "2",
                    **(cache.ENV if args.cache else {}),
                },
                log_dir=tmp, pinning=pinning, core=pinning.proxy_core, cwd=src,
            )  # fmt: skip
            stack.callback(proxy.stop)
            wait_for_health(proxy, f"http://127.0.0.1:{port}/healthz", timeout=300)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for stream in (False, True):
            if args.only in (None, "stream" if stream else "json"):
                _measure(counter, proxy, url, token, args, stream)


def _floor_program(port: int, upstream_url: str, *, cache: bool) -> tuple[str, ...]:
    program = ("bench/floor_proxy.py", "--port", str(port), "--upstream", upstream_url)
    return (*program, "--cache") if cache else program


if __name__ == "__main__":
    main()
