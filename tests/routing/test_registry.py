"""The registry's routes share one routing policy, which a configuration reload keeps."""

from __future__ import annotations

from llmgw.config.providers_file import ORDERED, Cooldown, DeploymentSpec, ModelAlias, Strategy
from llmgw.routing.breaker import FAILURES_TO_OPEN
from llmgw.routing.registry import _RESOLVED_MAX, ProviderRegistry
from tests.routing.test_fallback import OK, Stub

SPLIT = Strategy("weighted", (1.0, 3.0))


def registry(strategy: Strategy, cooldown: float) -> ProviderRegistry:
    providers = [Stub("a", lambda: OK), Stub("b", lambda: OK)]
    alias = ModelAlias("m", (DeploymentSpec("a", "x"), DeploymentSpec("b", "y")), strategy)
    return ProviderRegistry(providers, [alias], cooldowns={"a": Cooldown(cooldown)})  # type: ignore[list-item]


def test_every_route_shares_the_policy_and_a_reload_keeps_what_it_knows() -> None:
    routes = registry(ORDERED, 5.0)
    assert routes.resolve("m").routing is routes.resolve("a/x").routing is routes.routing
    for _ in range(FAILURES_TO_OPEN):
        routes.routing.attempt(routes.resolve("a/x").deployments[0]).failed()
    health = routes.routing.health("a:x")
    assert health.state == "open"
    assert health.open_until is not None
    assert health.last_failure_at is not None
    assert health.open_until - health.last_failure_at == 5.0

    routes.replace_with(registry(SPLIT, 60.0))
    assert routes.resolve("m").strategy == SPLIT
    assert routes.resolve("m").routing is routes.routing
    assert routes.routing.health("a:x").state == "open"
    assert [d.label for d in routes.routing.plan(routes.resolve("m").deployments, SPLIT)] == ["b:y"]


def test_a_name_no_alias_has_is_routed_by_one_chain_until_a_reload_replaces_its_provider() -> None:
    routes = registry(ORDERED, 5.0)
    chain = routes.resolve("a/z")
    assert routes.resolve("a/z") is chain  # made once, not for every request
    assert [d.label for d in chain.deployments] == ["a:z"]
    assert [d.label for d in routes.resolve("unknown").deployments] == ["a:unknown"]
    for n in range(2_000):  # callers choose names: what is kept stays bounded
        routes.resolve(f"b/{n}")
    assert len(routes._resolved) <= _RESOLVED_MAX
    assert routes.resolve("b/1999").deployments[0].label == "b:1999"

    reloaded = registry(ORDERED, 5.0)
    routes.replace_with(reloaded)
    after = routes.resolve("a/z")
    assert after is not chain
    assert after.deployments[0].provider is reloaded.providers[0]
