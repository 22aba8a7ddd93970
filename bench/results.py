"""What a benchmark run measured, as plain attrs classes that serialise straight to JSON."""

from __future__ import annotations

import attrs

from bench.load import MODEL, Percentiles

__all__ = [
    "BenchResult",
    "Check",
    "MemoryRun",
    "MemorySample",
    "Scenario",
    "ScenarioResult",
    "TargetResult",
]


@attrs.frozen
class Scenario:
    name: str  # e.g. "json-c64"
    title: str  # e.g. "non-streamed, c=64"
    stream: bool
    concurrency: int
    requests: int
    warmup: int
    model: str = MODEL  # what the requests ask for: the upstream's model, or an alias


@attrs.frozen
class ScenarioResult:
    scenario: str
    stream: bool
    concurrency: int
    requests: int
    errors: int
    error_samples: tuple[str, ...]
    wall_seconds: float
    requests_per_second: float
    latency_ms: Percentiles | None
    ttfb_ms: Percentiles | None
    # CPU (utime + stime) per measured request; None where there is no such process.
    proxy_cpu_us_per_request: float | None
    postgres_cpu_us_per_request: float | None
    redis_cpu_us_per_request: float | None
    upstream_cpu_us_per_request: float | None
    loadgen_cpu_us_per_request: float | None
    # Share of the other core used by load generator, upstream, Postgres and OTLP sink: near 1.0
    # means the load side, not the proxy, limited throughput.
    load_core_busy: float | None
    # Share of all cores' time used by processes outside the benchmark: above a few percent the
    # latency and throughput figures are disturbed.
    other_cpu_share: float | None
    proxy_rss_mib: float | None
    proxy_peak_rss_mib: float | None
    # Statement executions seen by pg_stat_statements per request, hot path and background alike,
    # with asyncpg's reset batch counted once: an upper bound on round trips per request.
    db_statements_per_request: float | None
    # The same without the usage ledger's background batches: the requests' own round trips.
    db_hot_path_round_trips_per_request: float | None
    db_statement_breakdown: dict[str, float] | None
    redis_commands_per_request: float | None


@attrs.frozen
class TargetResult:
    name: str  # baseline, floor, llmgw, llmgw-redis
    description: str
    scenarios: tuple[ScenarioResult, ...] = ()
    startup_seconds: float | None = None
    startup_rss_mib: float | None = None  # right after /healthz first answered
    peak_rss_mib: float | None = None
    notes: tuple[str, ...] = ()
    skipped: str | None = None
    # Through model aliases (bench.routing), measured next to the direct scenarios in one run.
    routing: tuple[ScenarioResult, ...] = ()

    def scenario(self, name: str) -> ScenarioResult | None:
        return next((result for result in self.scenarios if result.scenario == name), None)


@attrs.frozen
class MemorySample:
    requests_done: int
    rss_mib: float


@attrs.frozen
class MemoryRun:
    """One long non-streamed llmgw run, sampling the gateway's RSS as it goes."""

    requests_planned: int
    requests_done: int
    concurrency: int
    errors: int
    wall_seconds: float
    rss_start_mib: float
    samples: tuple[MemorySample, ...]
    peak_rss_mib: float
    gateway_requests_total: int  # including every earlier scenario and warm-up
    note: str = ""

    @property
    def rss_end_mib(self) -> float:
        return self.samples[-1].rss_mib if self.samples else self.rss_start_mib

    @property
    def growth_after_first_sample_mib(self) -> float:
        return self.rss_end_mib - self.samples[0].rss_mib if self.samples else 0.0


@attrs.frozen
class Check:
    target: str
    limit: str
    measured: str
    passed: bool | None  # None: not evaluated (the note says why)
    note: str = ""


@attrs.frozen
class BenchResult:
    date: str
    machine: str
    cores: int
    python: str
    commit: str  # git HEAD of the checkout, "+dirty" when it has local changes
    quick: bool
    pinning: str
    database: str
    wall_seconds: float
    targets: tuple[TargetResult, ...]
    memory: MemoryRun | None
    checks: tuple[Check, ...]
    notes: tuple[str, ...]
