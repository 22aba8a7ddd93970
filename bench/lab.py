"""The benchmark's world: upstream, OTLP sink, Postgres and a gateway key, plus how one scenario is
measured against whichever proxy is running.

All children are registered on the caller's ExitStack as they start, so an error or Ctrl-C at any
point stops everything that was started so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import attrs
import orjson

from bench.database import (
    Database,
    hot_path_round_trips,
    statement_deltas,
    statements_counted,
)
from bench.load import LoadResult, LoadSpec, run_load
from bench.procstat import CpuSnapshot, SystemCpu, descendants, memory
from bench.results import Scenario, ScenarioResult
from bench.services import (
    Child,
    ChildFailed,
    Pinning,
    adopt_for_the_run,
    free_port,
    redis_commands_processed,
    redis_pid,
    spawn,
    wait_for_health,
    wait_for_listening,
    wait_for_workers,
)

__all__ = ["PROVIDER_KEY", "Lab", "SetupError"]

PROVIDER_KEY = "venice-fake-provider-key-7f3a9c"  # tests/fake_venice.py FAKE_VENICE_KEY
REPO_ROOT = Path(__file__).resolve().parent.parent
CHUNKS = 20
_KEY_TIMEOUT_S = 120
_STATEMENTS_SHOWN = 8
_MIN_BUSY_WINDOW_US = 1_000_000
# Variables of the caller's shell that would change what the children do.
_SCRUBBED_PREFIXES = ("LLMGW_", "OTEL_", "VENICE_", "REDIS_")
_SCRUBBED = frozenset({"DATABASE_URL", "BIND_ADDR", "RATE_LIMIT_BACKEND", "LOG_LEVEL"})


class SetupError(Exception):
    """The benchmark could not build its world; the message says which part failed."""


def _base_env() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name not in _SCRUBBED and not name.startswith(_SCRUBBED_PREFIXES)
    }


@attrs.frozen
class _Reading:
    at: float
    proxy: CpuSnapshot
    postgres: CpuSnapshot
    upstream: CpuSnapshot
    loadgen: CpuSnapshot
    sink: CpuSnapshot
    redis: CpuSnapshot
    system: SystemCpu
    statements: dict[str, int] | None
    redis_commands: int | None


@attrs.define
class Lab:
    tmp: Path
    pinning: Pinning
    runner: asyncio.Runner
    stack: contextlib.ExitStack
    database: Database
    upstream: Child
    upstream_url: str
    sink: Child
    sink_url: str
    token: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_pid: int | None = None
    llmgw_src: Path = REPO_ROOT  # the llmgw source tree the gateway runs from

    # -- setting up ---------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        stack: contextlib.ExitStack,
        runner: asyncio.Runner,
        tmp: Path,
        pinning: Pinning,
        database_url: str | None,
        llmgw_src: Path = REPO_ROOT,
    ) -> Lab:
        upstream = _start_service(
            stack,
            "upstream",
            ["tests/fake_venice.py", "--port", "0", "--chunks", str(CHUNKS)],
            tmp,
            pinning,
        )
        sink = _start_service(
            stack, "otlp-sink", ["bench/otlp_sink.py", "--port", "0"], tmp, pinning
        )
        database = _open_database(stack, runner, tmp, database_url, pinning)
        lab = cls(
            tmp=tmp,
            pinning=pinning,
            runner=runner,
            stack=stack,
            database=database,
            upstream=upstream[0],
            upstream_url=upstream[1],
            sink=sink[0],
            sink_url=sink[1],
            llmgw_src=llmgw_src,
        )
        lab.token = lab.create_key()
        lab.redis_pid = redis_pid()
        # A system Redis is not ours, but it must share the load core like Postgres does.
        adopt_for_the_run(stack, [] if lab.redis_pid is None else [lab.redis_pid], pinning)
        return lab

    def database_env(self, *, migrate: bool) -> dict[str, str]:
        if self.database.embedded:
            assert self.database.data_dir is not None
            return {"LLMGW_DATA_DIR": str(self.database.data_dir)}
        env = {"DATABASE_URL": self.database.url}
        if migrate:
            env["LLMGW_AUTO_MIGRATE"] = "true"
        return env

    def source_env(self) -> dict[str, str]:
        # `python -m llmgw` imports from its working directory first; PYTHONPATH covers the rest.
        inherited = os.environ.get("PYTHONPATH")
        path = str(self.llmgw_src) if not inherited else f"{self.llmgw_src}{os.pathsep}{inherited}"
        return {"PYTHONPATH": path}

    def create_key(self) -> str:
        argv = [
            *self.pinning.prefix(self.pinning.rest_core),
            sys.executable, "-m", "llmgw", "keys", "create", "--name", "bench",
            "--rate-limit-requests", "100000000", "--rate-limit-window-seconds", "60", "--json",
        ]  # fmt: skip
        completed = subprocess.run(
            argv,
            # Creating the key also migrates an external database, as a release step would.
            env={**_base_env(), **self.database_env(migrate=True), **self.source_env()},
            cwd=self.llmgw_src,
            capture_output=True,
            timeout=_KEY_TIMEOUT_S,
            check=False,
        )
        if completed.returncode != 0:
            raise SetupError(f"llmgw keys create failed:\n{completed.stderr.decode()[-2000:]}")
        key: str = orjson.loads(completed.stdout.splitlines()[-1])["key"]
        return key

    def start_floor(self) -> tuple[Child, str]:
        child, url = _start_service(
            self.stack,
            "floor",
            ["bench/floor_proxy.py", "--port", "0", "--upstream", self.upstream_url],
            self.tmp,
            self.pinning,
            core=self.pinning.proxy_core,
        )
        return child, url + "/v1/chat/completions"

    def start_gateway(
        self, name: str, extra_env: Mapping[str, str], *, workers: int = 1
    ) -> tuple[Child, str, float]:
        """Spawn ``llmgw serve`` on the proxy core: the child, its chat URL and its startup time.

        With ``workers`` > 1 it is ``serve --workers N`` on both cores.
        Raises ChildFailed if it exits or never answers /healthz.
        """
        port = free_port()
        env = {
            **_base_env(),
            # As in production: the schema is already at head, the gateway only checks it.
            **self.database_env(migrate=False),
            "BIND_ADDR": f"127.0.0.1:{port}",
            "VENICE_API_KEY": PROVIDER_KEY,
            "VENICE_BASE_URL": self.upstream_url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.sink_url,
            # Bounded stop; requests are all finished by the time the benchmark stops it.
            "SHUTDOWN_GRACE_SECONDS": "2",
            **self.source_env(),
            **extra_env,
        }
        child = spawn(
            name,
            [
                sys.executable,
                "-m",
                "llmgw",
                "serve",
                *(["--workers", str(workers)] * (workers > 1)),
            ],
            env=env,
            log_dir=self.tmp,
            pinning=self.pinning,
            # Without taskset the workers would inherit this process's core, the load side's.
            core=self.pinning.proxy_core if workers == 1 else self.pinning.both_cores,
            cwd=self.llmgw_src,
        )
        self.stack.callback(child.stop)
        base = f"http://127.0.0.1:{port}"
        try:
            startup = wait_for_health(child, base + "/healthz")
            wait_for_workers(child, workers)
        except ChildFailed:
            child.stop()
            raise
        return child, base + "/v1/chat/completions", startup

    # -- measuring ----------------------------------------------------------------------

    async def _read(self, proxy: Child | None, *, cpu_first: bool) -> _Reading:
        # Statistics queries run outside the CPU window: before it opens and after it closes.
        statements = None if cpu_first else await self.database.statement_calls()
        redis = None if cpu_first else redis_commands_processed()
        at = time.perf_counter()
        cpu = (
            # The proxy and its children: the workers of ``serve --workers N``.
            CpuSnapshot.take([] if proxy is None else descendants(proxy.pid)),
            CpuSnapshot.take(self.database.server_pids()),
            CpuSnapshot.take([self.upstream.pid]),
            CpuSnapshot.take([os.getpid()]),
            CpuSnapshot.take([self.sink.pid]),
            CpuSnapshot.take([] if self.redis_pid is None else [self.redis_pid]),
            SystemCpu.take(),
        )
        if cpu_first:
            statements = await self.database.statement_calls()
            redis = redis_commands_processed()
        return _Reading(at, *cpu, statements, redis)

    def measure(
        self, scenario: Scenario, url: str, token: str | None, proxy: Child | None
    ) -> ScenarioResult:
        readings: list[_Reading] = []

        async def mark() -> None:
            readings.append(await self._read(proxy, cpu_first=bool(readings)))

        spec = LoadSpec(
            url=url,
            token=token,
            stream=scenario.stream,
            concurrency=scenario.concurrency,
            requests=scenario.requests,
            warmup=scenario.warmup,
            model=scenario.model,
        )
        load = self.runner.run(run_load(spec, mark))
        before, after = readings
        return self._summarise(scenario, load, before, after, proxy)

    def _summarise(
        self,
        scenario: Scenario,
        load: LoadResult,
        before: _Reading,
        after: _Reading,
        proxy: Child | None,
    ) -> ScenarioResult:
        n = load.requests
        proxy_cpu = after.proxy.since(before.proxy) if proxy is not None else None
        postgres_cpu = after.postgres.since(before.postgres) if after.postgres.per_pid else None
        redis_cpu = after.redis.since(before.redis) if after.redis.per_pid else None
        load_side = (
            after.upstream.since(before.upstream)
            + after.loadgen.since(before.loadgen)
            + after.sink.since(before.sink)
            + (postgres_cpu or 0)
            + (redis_cpu or 0)
        )
        ours = load_side + (proxy_cpu or 0)
        wall_us = (after.at - before.at) * 1e6
        cores = len(after.system.busy_us) or 1
        other = max(0, after.system.since(before.system) - ours)
        statements = _statement_figures(before.statements, after.statements, n)
        mem = None if proxy is None else memory(proxy.pid)
        return ScenarioResult(
            scenario=scenario.name,
            stream=scenario.stream,
            concurrency=scenario.concurrency,
            requests=n,
            errors=load.errors,
            error_samples=load.error_samples,
            wall_seconds=load.wall_seconds,
            requests_per_second=load.requests_per_second,
            latency_ms=load.latency_ms,
            ttfb_ms=load.ttfb_ms,
            proxy_cpu_us_per_request=None if proxy_cpu is None else proxy_cpu / n,
            postgres_cpu_us_per_request=None if postgres_cpu is None else postgres_cpu / n,
            redis_cpu_us_per_request=None if redis_cpu is None else redis_cpu / n,
            upstream_cpu_us_per_request=after.upstream.since(before.upstream) / n,
            loadgen_cpu_us_per_request=after.loadgen.since(before.loadgen) / n,
            load_core_busy=load_side / wall_us if self._busy_is_meaningful(wall_us) else None,
            other_cpu_share=other / (wall_us * cores) if wall_us >= _MIN_BUSY_WINDOW_US else None,
            proxy_rss_mib=None if mem is None else mem.rss_mib,
            proxy_peak_rss_mib=None if mem is None else mem.peak_rss_mib,
            db_statements_per_request=statements[0],
            db_hot_path_round_trips_per_request=statements[1],
            db_statement_breakdown=statements[2],
            redis_commands_per_request=_redis_per_request(before, after, n),
        )

    def _busy_is_meaningful(self, wall_us: float) -> bool:
        # CPU time comes in 10 ms clock ticks: a shorter window gives nonsense like 250%.
        return self.pinning.rest_core is not None and wall_us >= _MIN_BUSY_WINDOW_US

    def run_plain(self, spec: LoadSpec) -> LoadResult:
        return self.runner.run(run_load(spec))


def _statement_figures(
    before: dict[str, int] | None, after: dict[str, int] | None, requests: int
) -> tuple[float | None, float | None, dict[str, float] | None]:
    """All statements, hot-path round trips (both per request) and the top statements."""
    if before is None or after is None:
        return None, None, None
    deltas = statement_deltas(before, after)
    top = sorted(deltas.items(), key=lambda item: -item[1])[:_STATEMENTS_SHOWN]
    shown = {query[:160]: round(calls / requests, 3) for query, calls in top}
    return (
        statements_counted(deltas) / requests,
        hot_path_round_trips(deltas) / requests,
        shown,
    )


def _redis_per_request(before: _Reading, after: _Reading, requests: int) -> float | None:
    if before.redis_commands is None or after.redis_commands is None:
        return None
    # Our own INFO query is one of the commands counted in between.
    return max(0, after.redis_commands - before.redis_commands - 1) / requests


def _start_service(
    stack: contextlib.ExitStack,
    name: str,
    script_argv: list[str],
    tmp: Path,
    pinning: Pinning,
    *,
    core: int | None = None,
) -> tuple[Child, str]:
    child = spawn(
        name,
        [sys.executable, *script_argv],
        env=_base_env(),
        log_dir=tmp,
        pinning=pinning,
        core=pinning.rest_core if core is None else core,
        cwd=REPO_ROOT,
    )
    stack.callback(child.stop)
    return child, wait_for_listening(child)


def _open_database(
    stack: contextlib.ExitStack,
    runner: asyncio.Runner,
    tmp: Path,
    url: str | None,
    pinning: Pinning,
) -> Database:
    if url is None:
        try:
            database = Database.start_embedded(tmp / "data")
        except Exception as exc:
            raise SetupError(f"could not start the embedded Postgres: {exc}") from exc
        stack.callback(database.stop)
    else:
        database = Database.external(url)
    try:
        runner.run(database.connect())
    except Exception as exc:
        raise SetupError(f"cannot connect to the database: {exc}") from exc
    stack.callback(lambda: runner.run(database.disconnect()))
    if not database.embedded:
        # The embedded cluster inherited the load core from us; a local external one is moved.
        adopt_for_the_run(stack, database.server_pids(), pinning)
    return database
