"""A team's limits in the policy over the in-memory store: counters over all its keys, reserved in
the key's admission (all or nothing) and settled with it; each refusal names the team's limit."""

from __future__ import annotations

import uuid
from datetime import date
from typing import Any

import pytest

from llmgw.accounting.prices import Price
from llmgw.auth.authenticator import TeamLimits
from llmgw.errors import ModelNotAllowed, RateLimited
from llmgw.providers.base import Deployment
from tests.limits.test_policy import BODY, NOW, _Provider, _record, admit, key, policy
from tests.processes import Clock

QWEN = Price(1.0, 2.0)


def team(**limits: Any) -> TeamLimits:
    return TeamLimits(id=uuid.uuid4(), **limits)


async def refused_code(limits: Any, k: Any, model: str = "m") -> str | None:
    try:
        await admit(limits, k, model)
    except RateLimited as exc:
        return exc.code
    return None


async def test_team_concurrency_is_shared_by_its_keys_and_freed_at_settlement() -> None:
    limits = policy(Clock(NOW))
    shared = team(max_concurrent_requests=2)
    one, two = key(team=shared), key(team=shared)
    first = await admit(limits, one)
    await admit(limits, two)
    assert await refused_code(limits, key(team=shared)) == "team_concurrency_limit_exceeded"
    first.settle(_record(one))
    assert await limits.flush()
    assert await refused_code(limits, two) is None


async def test_a_team_refusal_takes_nothing_from_the_key() -> None:
    limits = policy(Clock(NOW))
    shared = team(max_concurrent_requests=1)
    await admit(limits, key(team=shared))
    mine = key(team=shared, max_concurrent_requests=1)
    assert await refused_code(limits, mine) == "team_concurrency_limit_exceeded"
    # The key's own slot was not taken by the refused admission: in another team it is admitted.
    assert await refused_code(limits, key(id=mine.id, max_concurrent_requests=1)) is None


async def test_team_request_window_counts_settled_requests_until_it_ends() -> None:
    clock = Clock(NOW)
    limits = policy(clock)
    shared = team(rate_limit_requests=3, rate_limit_window_seconds=60)
    keys = [key(team=shared) for _ in range(3)]
    for k in keys:
        (await admit(limits, k)).settle(_record(k))
    assert await limits.flush()
    assert await refused_code(limits, keys[0]) == "team_rate_limited"
    clock.now += 60
    assert await refused_code(limits, keys[0]) is None


async def _worst_cost(limits: Any) -> float:
    await limits.prices.loaded()
    worst = limits.worst_case(
        BODY,
        [Deployment(_Provider(), "m")],  # type: ignore[arg-type]
        produces_output=True,
        priced=True,
        model="m",
    )
    assert worst.cost_usd is not None
    return worst.cost_usd  # type: ignore[no-any-return]


async def test_team_budget_worth_five_worst_cases_admits_five_of_its_keys() -> None:
    limits = policy(Clock(NOW), m=QWEN)
    shared = team(monthly_budget_usd=5 * await _worst_cost(limits))
    codes = [await refused_code(limits, key(team=shared)) for _ in range(16)]
    assert codes == [None] * 5 + ["team_budget_exceeded"] * 11


async def test_team_tokens_per_minute() -> None:
    limits = policy(Clock(NOW))
    shared = team(tokens_per_minute=30)
    codes = [await refused_code(limits, key(team=shared)) for _ in range(3)]
    assert codes[-1] == "team_tokens_per_minute_exceeded"


async def test_a_model_the_team_does_not_allow_is_refused_whatever_the_key_allows() -> None:
    limits = policy(Clock(NOW))
    k = key(allowed_models=frozenset({"m", "n"}), team=team(allowed_models=frozenset({"n"})))
    with pytest.raises(ModelNotAllowed) as refused:
        await admit(limits, k, "m")
    assert "allowed: n" in refused.value.message
    assert await refused_code(limits, k, "n") is None


async def test_spend_carried_into_a_team_counts_against_its_budget_in_its_month_only() -> None:
    limits = policy(Clock(NOW), m=QWEN)
    worst = await _worst_cost(limits)
    this_month, last_month = date(2026, 12, 1), date(2026, 11, 1)
    carried = {"monthly_budget_usd": 2 * worst, "carried_spend_usd": worst}
    shared = team(carried_month=this_month, **carried)  # one worst case left
    codes = [await refused_code(limits, key(team=shared)) for _ in range(2)]
    assert codes == [None, "team_budget_exceeded"]
    stale = team(carried_month=last_month, **carried)  # carried last month: nothing now
    codes = [await refused_code(limits, key(team=stale)) for _ in range(3)]
    assert codes == [None, None, "team_budget_exceeded"]
