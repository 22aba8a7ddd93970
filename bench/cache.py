"""The ``cache-hit`` scenario (issue 30): the gateway with ``LLMGW_CACHE=memory`` answering the
same request again and again, so every measured request is a hit (the warm-up's first stores it).

Reports hit latency p50/p99 at c=1 and c=64, and checks that a hit costs the gateway less CPU than
the bare aiohttp floor spends passing the same request through (issue 30's target), and than llmgw
itself spends on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.results import Check, Scenario, ScenarioResult, TargetResult

__all__ = ["CACHE_TARGET", "ENV", "cache_check", "cache_section", "scenarios"]

CACHE_TARGET = "llmgw-cache"
ENV = {"LLMGW_CACHE": "memory"}
_FLOOR_SCENARIO = {1: "json-c1", 64: "json-c64"}


def scenarios(requests_c1: int, requests_c64: int) -> tuple[Scenario, ...]:
    return (
        Scenario(
            "cache-hit-c1", "cache hits, c=1", False, 1, requests_c1, max(1, requests_c1 // 10)
        ),
        Scenario(
            "cache-hit-c64",
            "cache hits, c=64",
            False,
            64,
            requests_c64,
            max(64, requests_c64 // 10),
        ),
    )


def _floor_cpu(target: TargetResult | None, hit: ScenarioResult) -> float | None:
    """CPU per request of ``target`` passing the same request through (its json scenario)."""
    if target is None:
        return None
    found = target.scenario(_FLOOR_SCENARIO[hit.concurrency])
    return None if found is None else found.proxy_cpu_us_per_request


def cache_check(targets: Sequence[TargetResult]) -> list[Check]:
    by_name = {t.name: t for t in targets}
    cache, floor = by_name.get(CACHE_TARGET), by_name.get("floor")
    if cache is None or cache.skipped is not None:
        return []
    checks = []
    for hit in cache.scenarios:
        miss_cpu = _floor_cpu(by_name.get("llmgw"), hit)  # the same request passed through llmgw
        if miss_cpu is not None and hit.proxy_cpu_us_per_request is not None:
            checks.append(
                Check(
                    f"{CACHE_TARGET} {hit.scenario}",
                    "gateway CPU per hit < llmgw's per pass-through",
                    f"{hit.proxy_cpu_us_per_request:.0f} µs vs {miss_cpu:.0f} µs",
                    hit.proxy_cpu_us_per_request < miss_cpu,
                )
            )
        floor_cpu, hit_cpu = _floor_cpu(floor, hit), hit.proxy_cpu_us_per_request
        if floor_cpu is None or hit_cpu is None:
            checks.append(Check(hit.scenario, "hit CPU < floor pass-through CPU", "-", None))
            continue
        checks.append(
            Check(
                f"{CACHE_TARGET} {hit.scenario}",
                "gateway CPU per hit < the floor's per pass-through",
                f"{hit_cpu:.0f} µs vs {floor_cpu:.0f} µs",
                hit_cpu < floor_cpu,
            )
        )
    return checks


def cache_section(targets: Sequence[TargetResult]) -> list[str]:
    by_name = {t.name: t for t in targets}
    cache = by_name.get(CACHE_TARGET)
    if cache is None or cache.skipped is not None:
        return []
    floor = by_name.get("floor")
    lines = [
        "## Cache hits (LLMGW_CACHE=memory, the same request repeated)",
        "",
        "| scenario | req/s | p50 ms | p99 ms | gateway CPU µs/hit | floor CPU µs/pass-through |",
        "|---|---|---|---|---|---|",
    ]
    for hit in cache.scenarios:
        latency = hit.latency_ms
        floor_cpu = _floor_cpu(floor, hit)
        lines.append(
            f"| {hit.scenario} | {hit.requests_per_second:.0f} "
            f"| {'-' if latency is None else f'{latency.p50:.2f}'} "
            f"| {'-' if latency is None else f'{latency.p99:.2f}'} "
            f"| {'-' if hit.proxy_cpu_us_per_request is None else f'{hit.proxy_cpu_us_per_request:.0f}'} "
            f"| {'-' if floor_cpu is None else f'{floor_cpu:.0f}'} |"
        )
    return [*lines, ""]
