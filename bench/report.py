"""Targets from the issue checked against one run's figures, and the run rendered as markdown."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.cache import cache_check, cache_section
from bench.results import BenchResult, Check, MemoryRun, Scenario, ScenarioResult, TargetResult
from bench.routing import DIRECT, ROUTED_CAPPED

__all__ = ["evaluate", "markdown"]

_RSS_LIMIT_MIB = 80.0
_RSS_GROWTH_LIMIT_MIB = 5.0
_STARTUP_LIMIT_S = 2.0
_MEMORY_TARGET_REQUESTS = 50_000
# Routing on the healthy path costs no CPU "within noise": what two measurements of the same
# requests by one process differ by on this machine.
_ROUTING_NOISE = 1.10

_Figure = Callable[[ScenarioResult], float | None]


def _latency_p50(result: ScenarioResult) -> float | None:
    return None if result.latency_ms is None else result.latency_ms.p50


def _ttfb_p50(result: ScenarioResult) -> float | None:
    return None if result.ttfb_ms is None else result.ttfb_ms.p50


def _figure(target: TargetResult | None, scenario: str, figure: _Figure) -> float | None:
    result = None if target is None else target.scenario(scenario)
    return None if result is None else figure(result)


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _by_name(targets: Sequence[TargetResult]) -> dict[str, TargetResult]:
    return {target.name: target for target in targets if target.skipped is None}


# ---------------------------------------------------------------------------------------------
# Checks


def _at_most(target: str, limit: str, measured: float | None, bound: float, shown: str) -> Check:
    if measured is None:
        return Check(target, limit, "n/a", None, "not measured")
    return Check(target, limit, shown, measured <= bound)


def _cpu_check(
    gateway: TargetResult, floor: TargetResult, scenario: str, title: str, factor: float
) -> Check:
    mine = _figure(gateway, scenario, lambda r: r.proxy_cpu_us_per_request)
    theirs = _figure(floor, scenario, lambda r: r.proxy_cpu_us_per_request)
    ratio = _ratio(mine, theirs)
    shown = f"{_fmt(ratio)}x ({_fmt(mine, 0)} vs {_fmt(theirs, 0)} µs)"
    return _at_most(f"{title}: gateway CPU/request vs floor", f"<= {factor}x", ratio, factor, shown)


def _added_check(
    gateway: TargetResult, baseline: TargetResult, scenario: str, title: str, figure: _Figure
) -> Check:
    mine = _figure(gateway, scenario, figure)
    reference = _figure(baseline, scenario, figure)
    added = None if mine is None or reference is None else mine - reference
    shown = f"+{_fmt(added)} ms ({_fmt(mine)} vs {_fmt(reference)} ms)"
    return _at_most(title, "<= +1.5 ms over baseline", added, 1.5, shown)


def _throughput_check(gateway: TargetResult, floor: TargetResult) -> Check:
    mine = _figure(gateway, "json-c64", lambda r: r.requests_per_second)
    theirs = _figure(floor, "json-c64", lambda r: r.requests_per_second)
    ratio = _ratio(mine, theirs)
    title = "non-streamed c=64: throughput vs floor"
    if ratio is None:
        return Check(title, ">= 40%", "n/a", None, "not measured")
    shown = f"{ratio * 100:.0f}% ({mine:.0f} vs {theirs:.0f} req/s)"
    return Check(title, ">= 40%", shown, ratio >= 0.40)


def _round_trip_check(gateway: TargetResult) -> Check:
    measured = [r for r in gateway.scenarios if r.db_hot_path_round_trips_per_request is not None]
    worst = max(measured, key=lambda r: r.db_hot_path_round_trips_per_request or 0.0, default=None)
    title = "database round trips per request on the hot path (worst scenario)"
    if worst is None or worst.db_hot_path_round_trips_per_request is None:
        return Check(title, "<= 1", "n/a", None, "not measured")
    top = list((worst.db_statement_breakdown or {}).items())[:4]
    shown = f"{worst.db_hot_path_round_trips_per_request:.2f} in {worst.scenario}"
    if top:
        shown += (
            f" ({_fmt(worst.db_statements_per_request)} statements with the usage ledger's "
            "batches: " + "; ".join(f"{calls:g}x {query[:50]}" for query, calls in top) + ")"
        )
    return _at_most(
        title,
        "<= 1",
        worst.db_hot_path_round_trips_per_request,
        1.05,  # periodic background work (key touch, window pruning) adds a few hundredths
        shown,
    )


def _postgres_cpu_check(gateway: TargetResult) -> Check:
    figures = [
        f"{r.scenario} {r.postgres_cpu_us_per_request:.0f}"
        for r in gateway.scenarios
        if r.postgres_cpu_us_per_request is not None
    ]
    if not figures:
        return Check("Postgres CPU per request reported", "reported", "n/a", False)
    return Check("Postgres CPU per request reported", "reported", "; ".join(figures) + " µs", True)


def _error_check(targets: Sequence[TargetResult]) -> Check:
    errors = sum(r.errors for t in targets for r in (*t.scenarios, *t.routing))
    return Check("no failed requests in any scenario", "0", str(errors), errors == 0)


def _routing_cpu(gateway: TargetResult, routed: ScenarioResult) -> float | None:
    """A routed scenario's proxy CPU per request over the direct one's (same requests)."""
    direct = next(
        (r.proxy_cpu_us_per_request for r in gateway.routing if r.scenario == DIRECT), None
    )
    return _ratio(routed.proxy_cpu_us_per_request, direct)


def _routing_checks(gateway: TargetResult) -> list[Check]:
    """Acceptance 5 of issue 19: routing adds no measurable CPU per request on the healthy path
    (the capped alias is reported, not checked: its store round trip is what caps cost)."""
    checks = []
    for routed in gateway.routing:
        if routed.scenario in (DIRECT, ROUTED_CAPPED):
            continue
        ratio = _routing_cpu(gateway, routed)
        shown = f"{_fmt(ratio)}x ({_fmt(routed.proxy_cpu_us_per_request, 0)} µs)"
        title = f"{routed.scenario}: gateway CPU/request vs direct ({DIRECT})"
        checks.append(_at_most(title, f"<= {_ROUTING_NOISE}x", ratio, _ROUTING_NOISE, shown))
    return checks


def _memory_checks(memory: MemoryRun | None) -> list[Check]:
    if memory is None:
        return [Check("memory after the long run", "<= 80 MiB", "n/a", None, "no long run")]
    note = ""
    if memory.gateway_requests_total < _MEMORY_TARGET_REQUESTS:
        note = f"only {memory.gateway_requests_total} requests served in total, not 50,000"
    rss = Check(
        f"gateway RSS after {memory.gateway_requests_total} requests",
        "<= 80 MiB",
        f"{memory.rss_end_mib:.1f} MiB (peak {memory.peak_rss_mib:.1f})",
        memory.rss_end_mib <= _RSS_LIMIT_MIB,
        note,
    )
    growth = memory.growth_after_first_sample_mib
    flat = Check(
        "gateway RSS flat across the long run (growth after the first segment)",
        f"<= {_RSS_GROWTH_LIMIT_MIB:.0f} MiB",
        f"{growth:+.1f} MiB",
        growth <= _RSS_GROWTH_LIMIT_MIB,
        note,
    )
    return [rss, flat]


def _startup_check(gateway: TargetResult, external_database: bool) -> Check:
    seconds = gateway.startup_seconds
    if seconds is None:
        return Check("startup (spawn to /healthz 200)", "< 2 s", "n/a", None, "not measured")
    if not external_database:
        return Check(
            "startup (spawn to /healthz 200)",
            "< 2 s with an external database",
            f"{seconds:.2f} s",
            None,
            "measured against the embedded cluster (already running); pass --database-url "
            "for the target's condition",
        )
    return Check("startup with an external database", "< 2 s", f"{seconds:.2f} s", seconds < 2.0)


def _gateway_checks(
    gateway: TargetResult, floor: TargetResult, baseline: TargetResult
) -> list[Check]:
    prefix = "" if gateway.name == "llmgw" else f"[{gateway.name}] "
    checks = [
        _cpu_check(gateway, floor, "json-c1", "non-streamed c=1", 2.5),
        _cpu_check(gateway, floor, "json-c64", "non-streamed c=64", 2.5),
        _added_check(gateway, baseline, "json-c1", "non-streamed c=1: added p50", _latency_p50),
        _throughput_check(gateway, floor),
        _added_check(gateway, baseline, "stream-c1", "streamed c=1: added TTFB p50", _ttfb_p50),
        _cpu_check(gateway, floor, "stream-c1", "streamed c=1", 2.0),
        _cpu_check(gateway, floor, "stream-c64", "streamed c=64", 2.0),
        _round_trip_check(gateway),
        _postgres_cpu_check(gateway),
    ]
    return [Check(prefix + c.target, c.limit, c.measured, c.passed, c.note) for c in checks]


def evaluate(
    targets: Sequence[TargetResult], memory: MemoryRun | None, *, external_database: bool
) -> list[Check]:
    """Every target of the issue that this run's figures can decide."""
    by_name = _by_name(targets)
    baseline, floor, gateway = (by_name.get(n) for n in ("baseline", "floor", "llmgw"))
    if baseline is None or floor is None or gateway is None:
        return [Check("all targets", "baseline, floor and llmgw measured", "missing", False)]
    checks = _gateway_checks(gateway, floor, baseline)
    checks += _routing_checks(gateway)
    checks += _memory_checks(memory)
    checks.append(_startup_check(gateway, external_database))
    redis = by_name.get("llmgw-redis")
    if redis is not None:
        checks += _gateway_checks(redis, floor, baseline)
    checks += cache_check(targets)
    checks.append(_error_check(targets))
    return checks


# ---------------------------------------------------------------------------------------------
# Markdown

_COLUMNS = (
    "target",
    "req/s",
    "p50 ms",
    "p99 ms",
    "+p50 vs baseline ms",
    "TTFB p50 ms",
    "errors",
    "proxy CPU µs/req",
    "Postgres CPU µs/req",
    "Redis CPU µs/req",
    "DB round trips / stmts per req",
    "peak RSS MiB",
    "load core busy",
    "other procs",
)


def _row(result: ScenarioResult, target: str, baseline: ScenarioResult | None) -> list[str]:
    p50 = _latency_p50(result)
    base_p50 = None if baseline is None else _latency_p50(baseline)
    added = None if p50 is None or base_p50 is None else p50 - base_p50
    return [
        target,
        f"{result.requests_per_second:.0f}",
        _fmt(p50),
        _fmt(None if result.latency_ms is None else result.latency_ms.p99),
        _fmt(added),
        _fmt(_ttfb_p50(result)) if result.stream else "-",
        str(result.errors),
        _fmt(result.proxy_cpu_us_per_request, 0),
        _fmt(result.postgres_cpu_us_per_request, 0),
        _fmt(result.redis_cpu_us_per_request, 0),
        f"{_fmt(result.db_hot_path_round_trips_per_request)} / "
        f"{_fmt(result.db_statements_per_request)}",
        _fmt(result.proxy_peak_rss_mib, 1),
        _percent(result.load_core_busy),
        _percent(result.other_cpu_share),
    ]


def _percent(share: float | None) -> str:
    return _fmt(None if share is None else share * 100, 0, "%")


def _table(rows: list[list[str]], header: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def _scenario_tables(result: BenchResult, scenarios: Sequence[Scenario]) -> list[str]:
    lines: list[str] = []
    measured = [t for t in result.targets if t.skipped is None]
    baseline = next((t for t in measured if t.name == "baseline"), None)
    for scenario in scenarios:
        rows = []
        for target in measured:
            found = target.scenario(scenario.name)
            if found is not None:
                reference = None if baseline is None else baseline.scenario(scenario.name)
                rows.append(_row(found, target.name, reference))
        lines += [f"### {scenario.title} ({scenario.requests} requests)", ""]
        lines += [*_table(rows, _COLUMNS), ""]
    return lines


def _headline(result: BenchResult, scenarios: Sequence[Scenario]) -> list[str]:
    by_name = _by_name(result.targets)
    floor = by_name.get("floor")
    header = (
        "mode",
        "gateway",
        "CPU/req ÷ floor",
        "req/s ÷ floor",
        "p50 over floor ms",
        "TTFB over floor ms",
    )
    rows: list[list[str]] = []
    for name in ("llmgw", "llmgw-redis", "llmgw-workers2"):
        gateway = by_name.get(name)
        if gateway is None:
            continue
        for scenario in scenarios:
            mine, theirs = gateway.scenario(scenario.name), None
            theirs = None if floor is None else floor.scenario(scenario.name)
            if mine is None or theirs is None:
                continue
            rows.append(_headline_row(scenario, name, mine, theirs))
    return ["## Headline: llmgw against the floor (same run)", "", *_table(rows, header), ""]


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _headline_row(
    scenario: Scenario, name: str, mine: ScenarioResult, theirs: ScenarioResult
) -> list[str]:
    cpu = _ratio(mine.proxy_cpu_us_per_request, theirs.proxy_cpu_us_per_request)
    rps = _ratio(mine.requests_per_second, theirs.requests_per_second)
    return [
        scenario.title,
        name,
        _fmt(cpu, 2, "x"),
        _fmt(None if rps is None else rps * 100, 0, "%"),
        _fmt(_difference(_latency_p50(mine), _latency_p50(theirs))),
        _fmt(_difference(_ttfb_p50(mine), _ttfb_p50(theirs))) if scenario.stream else "-",
    ]


def _routing(result: BenchResult) -> list[str]:
    gateway = _by_name(result.targets).get("llmgw")
    if gateway is None or not gateway.routing:
        return []
    header = (
        "requests",
        "req/s",
        "p50 ms",
        "proxy CPU µs/req",
        "CPU ÷ direct",
        "DB round trips / stmts per req",
    )
    rows = [
        [
            r.scenario,
            f"{r.requests_per_second:.0f}",
            _fmt(_latency_p50(r)),
            _fmt(r.proxy_cpu_us_per_request, 0),
            _fmt(_routing_cpu(gateway, r), 2, "x"),
            f"{_fmt(r.db_hot_path_round_trips_per_request)} / {_fmt(r.db_statements_per_request)}",
        ]
        for r in gateway.routing
    ]
    return ["## Routing on the healthy path: llmgw, same run", "", *_table(rows, header), ""]


def _checks(checks: Sequence[Check]) -> list[str]:
    verdict = {True: "PASS", False: "**FAIL**", None: "not checked"}
    rows = [[c.target, c.limit, c.measured, verdict[c.passed], c.note] for c in checks]
    return ["## Targets", "", *_table(rows, ("target", "limit", "measured", "result", "note")), ""]


def _memory(memory: MemoryRun | None) -> list[str]:
    if memory is None:
        return []
    samples = ", ".join(f"{s.requests_done}: {s.rss_mib:.1f}" for s in memory.samples)
    lines = [
        "## Memory: long non-streamed llmgw run",
        "",
        f"- {memory.requests_done} requests at c={memory.concurrency} in "
        f"{memory.wall_seconds:.1f} s, {memory.errors} errors; "
        f"{memory.gateway_requests_total} requests served by this gateway in total",
        f"- RSS at start {memory.rss_start_mib:.1f} MiB, at end {memory.rss_end_mib:.1f} MiB, "
        f"peak {memory.peak_rss_mib:.1f} MiB",
        f"- RSS (MiB) after N requests of the run: {samples}",
    ]
    if memory.note:
        lines.append(f"- {memory.note}")
    return [*lines, ""]


_NOISY_SHARE = 0.05


def _noise_note(result: BenchResult) -> list[str]:
    shares = [
        (r.other_cpu_share, f"{t.name} {r.scenario}")
        for t in result.targets
        for r in t.scenarios
        if r.other_cpu_share is not None
    ]
    worst = max(shares, default=None)
    if worst is None or worst[0] < _NOISY_SHARE:
        return []
    return [
        f"- **other processes were busy during the run** (up to {worst[0] * 100:.0f}% of the "
        f"machine, in {worst[1]}): latency and throughput figures of such scenarios are disturbed"
    ]


def _target_notes(result: BenchResult) -> list[str]:
    lines = _noise_note(result)
    for target in result.targets:
        if target.skipped is not None:
            lines.append(f"- **{target.name} skipped**: {target.skipped}")
        if target.startup_seconds is not None:
            lines.append(
                f"- {target.name} startup (spawn to /healthz 200): {target.startup_seconds:.2f} s, "
                f"RSS then {_fmt(target.startup_rss_mib, 1)} MiB"
            )
        lines += [f"- {target.name}: " + note.replace("\n", "\n    ") for note in target.notes]
        lines += [
            f"- {target.name} {r.scenario}: {r.errors} failed requests, e.g. {r.error_samples[0]!r}"
            for r in target.scenarios
            if r.errors and r.error_samples
        ]
    lines += [f"- {note}" for note in result.notes]
    return ["## Notes", "", *lines, ""] if lines else []


def markdown(result: BenchResult, scenarios: Sequence[Scenario]) -> str:
    lines = [
        f"# llmgw benchmark{' (quick: figures are not stable)' if result.quick else ''}",
        "",
        f"- date: {result.date}; machine: {result.machine}, {result.cores} cores; "
        f"Python {result.python}",
        f"- pinning: {result.pinning}; database: {result.database}; "
        f"run took {result.wall_seconds:.0f} s",
        f"- llmgw commit: {result.commit}",
        "- columns: CPU is utime+stime per measured request; 'load core busy' is the share of the "
        "other core used by load generator, upstream, databases and OTLP sink (near 100%: the load "
        "side limited throughput); 'other procs' is the share of the machine used by processes "
        "outside the benchmark; 'DB round trips / stmts' are per request from "
        "pg_stat_statements: the requests' own round trips (asyncpg's pool-reset batch once), "
        "then all statements including the usage ledger's background batch rows",
        "",
        *_scenario_tables(result, scenarios),
        *_headline(result, scenarios),
        *_routing(result),
        *cache_section(result.targets),
        *_checks(result.checks),
        *_memory(result.memory),
        *_target_notes(result),
    ]
    return "\n".join(lines)
