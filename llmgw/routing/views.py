"""What is shown of routing: each alias's strategy and deployments, each deployment's health (the
admin API's ``GET /admin/v1/routes``, ``llmgw routes``), and the same as gauges in /metrics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
from opentelemetry import metrics

from llmgw import __version__
from llmgw.routing.breaker import State
from llmgw.routing.registry import ProviderRegistry

__all__ = ["observe_health", "routes_view"]

METRIC_CIRCUIT_STATE = "llmgw.deployment.circuit.state"
METRIC_IN_FLIGHT = "llmgw.deployment.in_flight"


def _deployments(registry: ProviderRegistry) -> list[str]:
    """Every configured deployment, then every other one requests reached (``provider/model``)."""
    configured = [d.label for chain in registry.aliases.values() for d in chain.deployments]
    seen = dict.fromkeys(configured)
    seen.update(dict.fromkeys(registry.routing.known()))
    return list(seen)


def routes_view(registry: ProviderRegistry) -> dict[str, Any]:
    routing = registry.routing
    return {
        "aliases": [
            {
                "alias": alias,
                "strategy": chain.strategy.name,
                "weights": list(chain.strategy.weights) or None,
                "deployments": [d.label for d in chain.deployments],
            }
            for alias, chain in registry.aliases.items()
        ],
        "deployments": [attrs.asdict(routing.health(label)) for label in _deployments(registry)],
    }


def observe_health(meter_provider: metrics.MeterProvider, registry: ProviderRegistry) -> None:
    """Gauges read when metrics are collected (never on a request's path)."""
    meter = meter_provider.get_meter("llmgw", __version__)

    def states(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for label in _deployments(registry):
            current = registry.routing.health(label).state
            for state in State:
                yield metrics.Observation(
                    int(state.value == current), {"deployment": label, "state": state.value}
                )

    def in_flight(_options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        for label in _deployments(registry):
            yield metrics.Observation(
                registry.routing.health(label).in_flight, {"deployment": label}
            )

    meter.create_observable_gauge(
        METRIC_CIRCUIT_STATE,
        callbacks=[states],
        unit="1",
        description="1 for the circuit state each deployment is in on this replica, else 0",
    )
    meter.create_observable_gauge(
        METRIC_IN_FLIGHT,
        callbacks=[in_flight],
        unit="{request}",
        description="Requests a deployment is serving for this replica",
    )
