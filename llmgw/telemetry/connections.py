"""Upstream connections in /metrics: how many each provider's calls hold, and how many wait.

Observed when a reader collects (gauges of the providers' ``ConnectionPool`` counts), so nothing
is recorded on the request path. A reloaded configuration's providers are read from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics

from llmgw import __version__
from llmgw.providers.pool import ConnectionPool
from llmgw.telemetry import semconv as sc

__all__ = ["observe_connection_pools"]


def observe_connection_pools(
    meter_provider: metrics.MeterProvider, pools: Callable[[], Iterable[ConnectionPool]]
) -> None:
    meter = meter_provider.get_meter("llmgw", __version__)

    def gauge(name: str, description: str, value: Callable[[ConnectionPool], int]) -> None:
        def observe(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
            return [
                metrics.Observation(value(pool), {sc.GEN_AI_PROVIDER_NAME: pool.provider})
                for pool in pools()
            ]

        meter.create_observable_gauge(
            name, callbacks=[observe], unit="{connection}", description=description
        )

    gauge(
        sc.METRIC_UPSTREAM_CONNECTIONS_IN_USE,
        "Upstream connections held by calls in flight (a stream holds one until it ends)",
        lambda pool: pool.in_use,
    )
    gauge(
        sc.METRIC_UPSTREAM_CONNECTIONS_WAITING,
        "Calls waiting for a free upstream connection (past max_connections)",
        lambda pool: pool.waiting,
    )
    gauge(
        sc.METRIC_UPSTREAM_CONNECTIONS_LIMIT,
        "Each provider's max_connections",
        lambda pool: pool.max_connections,
    )
