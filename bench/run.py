"""Benchmark llmgw against a direct-to-upstream baseline and a minimal aiohttp proxy (the floor).

Usage (from the repository root): ``python -m bench [--quick] [--database-url URL]
[--json PATH] [--backends postgres,redis]`` or ``python bench/run.py ...``. Prints a markdown
report on stdout (progress goes to stderr) and writes every figure to JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable so `bench.*` resolves.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import contextlib
import datetime
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from types import FrameType

import attrs
import orjson

from bench import cache, routing
from bench.lab import PROVIDER_KEY, REPO_ROOT, Lab, SetupError
from bench.load import LoadSpec
from bench.procstat import memory
from bench.report import evaluate, markdown
from bench.results import (
    BenchResult,
    MemoryRun,
    MemorySample,
    Scenario,
    ScenarioResult,
    TargetResult,
)
from bench.services import Child, ChildFailed, Pinning, redis_answers

__all__ = ["Plan", "main"]

BENCH_DIR = Path(__file__).resolve().parent
DISTURBED = 0.10  # share of the machine used by other processes that spoils a measurement
_RETRY_RESERVE_S = 120.0  # retries stop when less than this is left of the budget
_BACKENDS = ("postgres", "redis")


@attrs.frozen
class Plan:
    scenarios: tuple[Scenario, ...]
    long_run_requests: int
    long_run_segments: int
    long_run_concurrency: int
    budget_seconds: float  # the whole run, setup included
    quick: bool
    routing: tuple[Scenario, ...]  # through aliases, on the llmgw target only (bench.routing)
    cache: tuple[Scenario, ...] = ()  # cache hits, on the llmgw-cache target (bench.cache)
    # On a shared machine: measure a scenario again (up to this often) while other processes
    # used more than DISTURBED of the machine, and keep the least disturbed measurement.
    retries_if_disturbed: int = 0

    @classmethod
    def full(cls) -> Plan:
        return cls(
            _scenarios(2000, 200, 10_000, 1000, 1000, 100, 4000, 400),
            50_000,
            10,
            64,
            280,
            False,
            routing.scenarios(10_000, 1000),
            cache.scenarios(2000, 10_000),
            retries_if_disturbed=2,
        )

    @classmethod
    def quick_plan(cls) -> Plan:
        return cls(
            _scenarios(40, 10, 256, 64, 20, 5, 192, 64),
            512,
            4,
            64,
            55,
            True,
            routing.scenarios(256, 64),
            cache.scenarios(40, 256),
        )


def _scenarios(*counts: int) -> tuple[Scenario, ...]:
    json1, json1_warm, json64, json64_warm, sse1, sse1_warm, sse64, sse64_warm = counts
    return (
        Scenario("json-c1", "non-streamed, c=1", False, 1, json1, json1_warm),
        Scenario("json-c64", "non-streamed, c=64", False, 64, json64, json64_warm),
        Scenario("stream-c1", "streamed (20 chunks), c=1", True, 1, sse1, sse1_warm),
        Scenario("stream-c64", "streamed (20 chunks), c=64", True, 64, sse64, sse64_warm),
    )


def _progress(started: float, message: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)


def _disturbed(result: ScenarioResult) -> bool:
    return result.other_cpu_share is not None and result.other_cpu_share > DISTURBED


def _disturbance(result: ScenarioResult) -> tuple[int, float]:
    # Of two measurements, the one without failed requests, then the less disturbed one.
    return (result.errors, result.other_cpu_share or 0.0)


def _describe(result: ScenarioResult) -> str:
    p50 = "n/a" if result.latency_ms is None else f"{result.latency_ms.p50:.2f}"
    cpu = result.proxy_cpu_us_per_request
    other = result.other_cpu_share
    return (
        f"{result.scenario}: {result.requests_per_second:.0f} req/s, p50 {p50} ms, "
        f"{result.errors} errors"
        + ("" if cpu is None else f", proxy {cpu:.0f} µs/req")
        + ("" if other is None else f", other processes {other * 100:.0f}%")
    )


@attrs.define
class _Bench:
    lab: Lab
    plan: Plan
    started: float
    gateways_after_long_run: int = 0

    def progress(self, message: str) -> None:
        _progress(self.started, message)

    def scenarios(
        self,
        name: str,
        url: str,
        token: str,
        proxy: Child | None,
        scenarios: Sequence[Scenario] | None = None,
    ) -> tuple[ScenarioResult, ...]:
        results = []
        for scenario in self.plan.scenarios if scenarios is None else scenarios:
            if proxy is not None and not proxy.alive():
                self.progress(
                    f"{name} exited (status {proxy.process.returncode}): scenarios left out"
                )
                break
            result = self.lab.measure(scenario, url, token, proxy)
            self.progress(f"{name} {_describe(result)}")
            for _ in range(self.plan.retries_if_disturbed):
                if not _disturbed(result) or self.time_left() < _RETRY_RESERVE_S:
                    break
                again = self.lab.measure(scenario, url, token, proxy)
                self.progress(f"{name} again (disturbed): {_describe(again)}")
                result = min(result, again, key=_disturbance)
            results.append(result)
        return tuple(results)

    def time_left(self) -> float:
        return self.plan.budget_seconds - (time.monotonic() - self.started)

    def baseline(self) -> TargetResult:
        url = self.lab.upstream_url + "/chat/completions"
        return TargetResult(
            "baseline",
            "direct to the fake upstream",
            self.scenarios("baseline", url, PROVIDER_KEY, None),
        )

    def floor(self) -> TargetResult:
        child, url = self.lab.start_floor()
        try:
            results = self.scenarios("floor", url, self.lab.token, child)
            peak = memory(child.pid)
        finally:
            child.stop()
        return TargetResult(
            "floor",
            "bench/floor_proxy.py, a minimal aiohttp pass-through",
            results,
            peak_rss_mib=None if peak is None else peak.peak_rss_mib,
        )

    def gateway(
        self, backend: str, long_run: bool, workers: int = 1, *, public_apis_only: bool = False
    ) -> tuple[TargetResult, MemoryRun | None]:
        name = "llmgw" if backend == "postgres" else f"llmgw-{backend}"
        description = f"python -m llmgw serve, RATE_LIMIT_BACKEND={backend}"
        if public_apis_only:
            # The cost of llmgw.compat's fast paths: the same gateway with all of them off.
            name += "-public-apis"
            description += ", LLMGW_PUBLIC_APIS_ONLY=true (no private-name fast path)"
        if workers > 1:
            name += f"-workers{workers}"
            description = (
                f"python -m llmgw serve --workers {workers}, RATE_LIMIT_BACKEND={backend}, "
                "on both cores (the workers share them with the niced load side)"
            )
            if self.lab.pinning.rest_core is None:
                return TargetResult(name, description, skipped="fewer than 2 usable cores"), None
        if backend == "redis" and not redis_answers():
            return TargetResult(
                name, description, skipped="no Redis answers on 127.0.0.1:6379"
            ), None
        env = {
            "RATE_LIMIT_BACKEND": backend,
            "LLMGW_CONFIG": str(routing.providers_file(self.lab.tmp, self.lab.upstream_url)),
        }
        if backend == "redis":
            env["REDIS_URL"] = self.lab.redis_url
        if public_apis_only:
            env["LLMGW_PUBLIC_APIS_ONLY"] = "true"
        try:
            child, url, startup = self.lab.start_gateway(name, env, workers=workers)
        except ChildFailed as exc:
            return TargetResult(
                name, description, skipped=f"the gateway did not start: {exc}"
            ), None
        if workers > 1:
            self.progress(f"load generator {_nice_load_generator()}")
        try:
            at_start = memory(child.pid)
            results = self.scenarios(name, url, self.lab.token, child)
            routed = (
                # Right after the direct ones, by the same process: their ratio is the cost.
                self.scenarios(name, url, self.lab.token, child, self.plan.routing)
                if name == "llmgw"
                else ()
            )
            alive = child.alive()
            memory_run = (
                self.memory_run(child, url, (*results, *routed)) if long_run and alive else None
            )
            peak = memory(child.pid)
            exit_status = child.process.poll()
        finally:
            child.stop()
        notes = _backend_notes(backend, results)
        if exit_status is not None:
            # Crashed, or stopped from outside: a graceful exit logs "llmgw stopped".
            notes += (f"the gateway exited during the run (status {exit_status})",)
        if any(result.errors for result in results):
            notes += (f"requests failed; the gateway's last log lines:\n{child.log_tail(8)}",)
        return (
            TargetResult(
                name,
                description,
                results,
                startup_seconds=startup,
                startup_rss_mib=None if at_start is None else at_start.rss_mib,
                peak_rss_mib=None if peak is None else peak.peak_rss_mib,
                notes=notes,
                routing=routed,
            ),
            memory_run,
        )

    def cache_hits(self) -> TargetResult:
        """The gateway answering from its memory cache: every measured request a hit."""
        name = cache.CACHE_TARGET
        description = "python -m llmgw serve, RATE_LIMIT_BACKEND=postgres, LLMGW_CACHE=memory"
        env = {
            **cache.ENV,
            "LLMGW_CONFIG": str(routing.providers_file(self.lab.tmp, self.lab.upstream_url)),
        }
        try:
            child, url, startup = self.lab.start_gateway(name, env)
        except ChildFailed as exc:
            return TargetResult(name, description, skipped=f"the gateway did not start: {exc}")
        try:
            results = self.scenarios(name, url, self.lab.token, child, self.plan.cache)
        finally:
            child.stop()
        return TargetResult(name, description, results, startup_seconds=startup)

    def memory_run(self, child: Child, url: str, results: Sequence[ScenarioResult]) -> MemoryRun:
        planned = self.plan.long_run_requests
        requests, note = self._long_run_size(results)
        segments = self.plan.long_run_segments
        per_segment = max(1, requests // segments)
        start = memory(child.pid)
        samples: list[MemorySample] = []
        errors = 0
        wall = 0.0
        for index in range(segments):
            spec = LoadSpec(url, self.lab.token, False, self.plan.long_run_concurrency, per_segment)
            load = self.lab.run_plain(spec)
            errors += load.errors
            wall += load.wall_seconds
            now = memory(child.pid)
            samples.append(
                MemorySample((index + 1) * per_segment, 0.0 if now is None else now.rss_mib)
            )
        self.progress(
            f"llmgw long run: {per_segment * segments} requests, RSS {samples[-1].rss_mib:.1f} MiB"
        )
        end = memory(child.pid)
        warmups = {s.name: s.warmup for s in (*self.plan.scenarios, *self.plan.routing)}
        earlier = sum(r.requests + warmups[r.scenario] for r in results)
        return MemoryRun(
            requests_planned=planned,
            requests_done=per_segment * segments,
            concurrency=self.plan.long_run_concurrency,
            errors=errors,
            wall_seconds=wall,
            rss_start_mib=0.0 if start is None else start.rss_mib,
            samples=tuple(samples),
            peak_rss_mib=0.0 if end is None else end.peak_rss_mib,
            gateway_requests_total=earlier + per_segment * segments,
            note=note,
        )

    def _long_run_size(self, results: Sequence[ScenarioResult]) -> tuple[int, str]:
        """As many of the planned requests as fit the time left, keeping time for what follows."""
        planned = self.plan.long_run_requests
        json64 = next((r for r in results if r.scenario == "json-c64"), None)
        if json64 is None or json64.requests_per_second <= 0:
            return planned, ""
        # Each gateway still to come needs about what this one took: scenarios, warm-ups, startup.
        per_gateway = 1.2 * sum(r.wall_seconds for r in results) + 10.0
        reserve = self.gateways_after_long_run * per_gateway + 5.0
        left = self.plan.budget_seconds - (time.monotonic() - self.started) - reserve
        fits = int(max(0.0, left) * json64.requests_per_second * 0.9)
        if fits >= planned:
            return planned, ""
        segments = self.plan.long_run_segments
        requests = max(fits // segments, self.plan.long_run_concurrency) * segments
        return requests, (
            f"the long run was cut to {requests} requests (of {planned} planned) to stay within "
            f"the {self.plan.budget_seconds:.0f} s budget"
        )


def _backend_notes(backend: str, results: Sequence[ScenarioResult]) -> tuple[str, ...]:
    if backend != "redis":
        return ()
    per_request = [
        r.redis_commands_per_request for r in results if r.redis_commands_per_request is not None
    ]
    if per_request and max(per_request) < 0.5:
        return (
            "the gateway sent (almost) no commands to Redis with RATE_LIMIT_BACKEND=redis: the redis "
            "backend does not seem to be implemented yet, so these figures are the postgres backend's",
        )
    return ()


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(source: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--no-optional-locks", *args],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout.strip()


def _commit(source: Path) -> str:
    """HEAD of the llmgw checkout (read-only git queries), "+dirty" with local changes."""
    if not (source / ".git").exists():
        return f"unknown (not a git checkout: {source})"
    try:
        head = _git(source, "rev-parse", "--short", "HEAD")
        dirty = _git(source, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return f"unknown ({source})"
    return head + ("+dirty" if dirty else "")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    # The load generator shares a core with upstream and Postgres; uvloop keeps its share small.
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, so every child and temporary directory is cleaned up.
    raise KeyboardInterrupt


def _measure_all(
    bench: _Bench, backends: Sequence[str]
) -> tuple[list[TargetResult], MemoryRun | None]:
    targets = [bench.baseline(), bench.floor()]
    memory_run: MemoryRun | None = None
    if "postgres" in backends:
        # The backends after postgres, the public-API row, the cache row and the workers row.
        bench.gateways_after_long_run = len(backends) - list(backends).index("postgres") + 2
    for backend in backends:
        target, run = bench.gateway(backend, long_run=backend == "postgres")
        if target.skipped is not None:
            bench.progress(f"{target.name} skipped: {target.skipped.splitlines()[0]}")
        targets.append(target)
        memory_run = memory_run or run
        if backend == "postgres":
            # Right after the fast paths' row, so both see the machine alike.
            targets.append(bench.gateway(backend, long_run=False, public_apis_only=True)[0])
    if "postgres" in backends:
        targets.append(bench.cache_hits())
    if "postgres" in backends:
        # Measured last: once the workers run, the load generator gives way to them (it shares a
        # core with one of them) and stays niced.
        target, _ = bench.gateway("postgres", long_run=False, workers=2)
        targets.append(target)
    return targets, memory_run


def _nice_load_generator(step: int = 10) -> str:
    # PRIO_PROCESS 0 is this thread on Linux: the load generator's, not the measured processes'.
    current = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, min(19, current + step))
    return f"niced from {current} to {os.getpriority(os.PRIO_PROCESS, 0)}"


def _run(args: argparse.Namespace, plan: Plan, started: float) -> BenchResult:
    pinning = Pinning.detect(args.nice)
    priority = pinning.pin_self()
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        runner = stack.enter_context(asyncio.Runner(loop_factory=_loop_factory()))
        _progress(started, f"setting up in {tmp} ({pinning.note})")
        lab = Lab.open(stack, runner, tmp, pinning, args.database_url, args.llmgw_src)
        _progress(started, "upstream, OTLP sink, Postgres and key ready")
        bench = _Bench(lab, plan, started)
        targets, memory_run = _measure_all(bench, args.backends)
        checks = evaluate(targets, memory_run, external_database=args.database_url is not None)
        notes = [pinning.note, priority]
        if lab.database.note:
            notes.append(lab.database.note)
        if lab.database.embedded:
            notes.append(
                "embedded Postgres runs with pg_stat_statements preloaded (to count statements)"
            )
        return BenchResult(
            date=datetime.date.today().isoformat(),
            machine=_machine(),
            cores=os.cpu_count() or 0,
            python=platform.python_version(),
            commit=_commit(args.llmgw_src),
            quick=plan.quick,
            pinning=pinning.note,
            database="external (--database-url)" if args.database_url else "embedded",
            wall_seconds=time.monotonic() - started,
            targets=tuple(targets),
            memory=memory_run,
            checks=tuple(checks),
            notes=tuple(notes),
        )


def _backends(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in _BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(_BACKENDS)}, not {text!r}")
    return names


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark llmgw against a direct baseline and a minimal aiohttp proxy.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny request counts (< 60 s): checks that it all runs"
    )
    parser.add_argument(
        "--database-url", help="postgresql://... to use instead of an embedded Postgres"
    )
    parser.add_argument(
        "--json",
        type=Path,
        help="where to write all figures (default bench/results.json, "
        "bench/results-quick.json with --quick)",
    )
    parser.add_argument(
        "--llmgw-src",
        type=lambda text: Path(text).resolve(),
        default=REPO_ROOT,
        help="llmgw source tree to run the gateway from, e.g. an exported commit "
        "(default: this checkout)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the benchmark and every measured process at this nice value, e.g. -10 on a "
        "shared machine so other work disturbs the figures less (needs root; default 0)",
    )
    parser.add_argument(
        "--backends",
        type=_backends,
        default=list(_BACKENDS),
        help="rate-limit backends to measure llmgw with (default postgres,redis)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    plan = Plan.quick_plan() if args.quick else Plan.full()
    json_path: Path = args.json or BENCH_DIR / (
        "results-quick.json" if args.quick else "results.json"
    )
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = _run(args, plan, started)
    except KeyboardInterrupt:
        print("interrupted; children stopped and temporary files removed", file=sys.stderr)
        return 130
    except (SetupError, ChildFailed) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    json_path.write_bytes(orjson.dumps(attrs.asdict(result), option=orjson.OPT_INDENT_2))
    print(markdown(result, plan.scenarios))
    _progress(started, f"done; figures written to {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
