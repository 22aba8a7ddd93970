"""The limit policy over the in-memory store with a fake clock: no database, no network."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from llmgw.accounting.price import Metered
from llmgw.accounting.prices import Price, PriceRule, PriceTable
from llmgw.auth.authenticator import AuthenticatedKey
from llmgw.errors import ModelNotAllowed, PriceUnknown, RateLimited, ServiceUnavailable
from llmgw.limits.memory import MemoryLimitStore
from llmgw.limits.policy import LimitPolicy
from llmgw.limits.store import Admission, Charge
from llmgw.providers.base import Deployment
from tests.processes import Clock, eventually
from tests.usage_records import usage_record

NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC).timestamp()
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


class _Provider:
    name = "p"


def key(**fields: Any) -> AuthenticatedKey:
    values: dict[str, Any] = {"id": uuid.uuid4(), "prefix": "llmg_abcdefg", "subject_id": None}
    values |= {"rate_limit_requests": 1000, "rate_limit_window_seconds": 60, **fields}
    return AuthenticatedKey(**values)


def policy(clock: Clock, **prices: Price) -> LimitPolicy:
    table = PriceTable([PriceRule(f"p:{model}", price) for model, price in prices.items()])
    return LimitPolicy(MemoryLimitStore(clock=clock), table, lease_seconds=30, clock=clock)


async def admit(
    limits: LimitPolicy,
    k: AuthenticatedKey,
    model: str = "m",
    metered: Metered | None = None,
    *,
    stored_answer: bool = False,
) -> Any:
    ticket = await limits.admit(k, reserving=True)
    await ticket.reserve(
        model=model,
        body=BODY,
        deployments=[Deployment(_Provider(), model)],  # type: ignore[arg-type]
        produces_output=True,
        metered=metered,
        stored_answer=stored_answer,
    )
    return ticket


async def test_concurrency_slots_are_taken_and_freed() -> None:
    clock = Clock(NOW)
    limits = policy(clock)
    k = key(max_concurrent_requests=2)
    first, _ = await admit(limits, k), await admit(limits, k)
    with pytest.raises(RateLimited) as refused:
        await admit(limits, k)
    assert refused.value.code == "concurrency_limit_exceeded"
    first.settle(_record(k))
    assert await limits.flush()
    await admit(limits, k)


async def test_a_killed_replicas_slot_expires_with_its_lease() -> None:
    clock = Clock(NOW)
    limits = policy(clock)
    k = key(max_concurrent_requests=1)
    await admit(limits, k)  # never settled
    with pytest.raises(RateLimited):
        await admit(limits, k)
    clock.now += 31
    await admit(limits, k)


async def test_budget_reserves_the_worst_case_and_prices_are_required() -> None:
    clock = Clock(NOW)
    price = Price(input_usd_per_mtok=1_000.0, output_usd_per_mtok=10_000.0)
    limits = policy(clock, m=price)
    # Worst case: ceil(len('[{"role":"user","content":"hi"}]') / 4) = 8 input + 10 output tokens.
    worst = price.worst_cost(8, 10)
    k = key(subject_id=uuid.uuid4(), monthly_budget_usd=worst * 3)
    for _ in range(3):
        await admit(limits, k)
    with pytest.raises(RateLimited) as refused:
        await admit(limits, k)
    assert refused.value.code == "budget_exceeded"
    assert refused.value.headers["Retry-After"] == str(31 * 86400 - 12 * 3600 - 30)
    with pytest.raises(PriceUnknown):
        await admit(limits, k, model="unpriced")


async def test_a_media_call_reserves_its_media_price_not_tokens() -> None:
    limits = policy(Clock(), image=Price(1_000.0, 10_000.0, image_usd=0.25), tokens=Price(1, 1))
    subject = uuid.uuid4()
    k = key(subject_id=subject, monthly_budget_usd=1.0)
    await admit(limits, k, model="image", metered=Metered("image", 2))
    assert await limits.budget_reserved(subject) == 0.5
    with pytest.raises(RateLimited):  # 0.5 more fits; 0.75 does not
        await admit(limits, k, model="image", metered=Metered("image", 3))
    with pytest.raises(PriceUnknown, match="no known price per image"):
        await admit(limits, k, model="tokens", metered=Metered("image", 1))


async def test_a_subjects_reserved_spend_is_its_requests_in_flight() -> None:
    clock = Clock(NOW)
    price = Price(input_usd_per_mtok=1_000.0, output_usd_per_mtok=10_000.0)
    limits = policy(clock, m=price)
    subject = uuid.uuid4()
    k = key(subject_id=subject, monthly_budget_usd=1.0)
    assert await limits.budget_reserved(subject) == 0
    first, _ = await admit(limits, k), await admit(limits, k)
    assert await limits.budget_reserved(subject) == pytest.approx(2 * price.worst_cost(8, 10))
    first.settle(_record(k))
    assert await limits.flush()
    assert await limits.budget_reserved(subject) == pytest.approx(price.worst_cost(8, 10))
    assert await limits.budget_reserved(uuid.uuid4()) == 0


async def test_tokens_per_minute_reserve_in_the_current_minute() -> None:
    clock = Clock(NOW)
    limits = policy(clock)
    k = key(tokens_per_minute=36)  # two worst cases of 18 tokens
    await admit(limits, k)
    await admit(limits, k)
    with pytest.raises(RateLimited) as refused:
        await admit(limits, k)
    assert refused.value.code == "tokens_per_minute_exceeded"
    assert refused.value.headers["Retry-After"] == "30"
    clock.now += 30
    await admit(limits, k)


async def test_the_window_and_the_allowlist_come_first() -> None:
    limits = policy(Clock(NOW))
    with pytest.raises(ModelNotAllowed):
        await admit(limits, key(allowed_models=frozenset({"other"})))
    k = key(rate_limit_requests=1, max_concurrent_requests=5)
    await admit(limits, k)
    with pytest.raises(RateLimited) as refused:
        await admit(limits, k)
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_stored_answer_takes_its_places_but_no_tokens_or_spend() -> None:
    """The response cache's answer uses no provider's tokens or spend: a key whose tokens per
    minute and budget are used up still gets it, while its request window and concurrency
    slots count it like any request."""
    clock = Clock(NOW)
    price = Price(input_usd_per_mtok=1_000.0, output_usd_per_mtok=10_000.0)
    limits = policy(clock, m=price)
    subject = uuid.uuid4()
    k = key(
        subject_id=subject,
        monthly_budget_usd=price.worst_cost(8, 10),  # one worst case of 18 tokens
        tokens_per_minute=18,
        max_concurrent_requests=2,
    )
    await admit(limits, k)  # in flight: every token and the whole budget reserved
    with pytest.raises(RateLimited) as refused:
        await admit(limits, k)
    assert refused.value.code in {"tokens_per_minute_exceeded", "budget_exceeded"}
    stored = await admit(limits, k, stored_answer=True)  # the last concurrency slot
    assert await limits.budget_reserved(subject) == pytest.approx(price.worst_cost(8, 10))
    with pytest.raises(RateLimited) as refused:
        await admit(limits, k, stored_answer=True)
    assert refused.value.code == "concurrency_limit_exceeded"
    stored.settle(_record(k))
    assert await limits.flush()
    await admit(limits, k, stored_answer=True)  # its slot was given back


async def test_a_stored_answer_of_a_key_limiting_only_tokens_counts_its_window() -> None:
    limits = policy(Clock(NOW))
    k = key(tokens_per_minute=18, rate_limit_requests=2)
    await admit(limits, k)  # every token of the minute reserved
    await admit(limits, k, stored_answer=True)
    with pytest.raises(RateLimited, match="Rate limit of 2 requests"):
        await admit(limits, k, stored_answer=True)


async def _calls_after_all(ticket: Any) -> None:
    """The stored answer ``ticket`` was reserved for did not come: it calls the provider."""
    await ticket.reserve_call(
        model="m",
        body=BODY,
        deployments=[Deployment(_Provider(), "m")],  # type: ignore[arg-type]
        produces_output=True,
    )


async def test_a_stored_answer_that_turns_into_a_call_reserves_its_tokens_then() -> None:
    """A follower of an identical request in flight reserves as a stored answer; when that
    answer does not come it calls, and reserves its tokens only then (or is refused)."""
    limits = policy(Clock(NOW))
    k = key(tokens_per_minute=36, max_concurrent_requests=3)  # two worst cases of 18
    await admit(limits, k)
    follower = await admit(limits, k, stored_answer=True)
    other = await admit(limits, k)  # the follower reserved no tokens: room for one more call
    with pytest.raises(RateLimited) as refused:
        await _calls_after_all(follower)
    assert refused.value.code == "tokens_per_minute_exceeded"
    follower.settle(None)  # refused: its request ends
    other.settle(None)
    assert await limits.flush()
    follower = await admit(limits, k, stored_answer=True)
    await _calls_after_all(follower)
    with pytest.raises(RateLimited, match="tokens per minute"):
        await admit(limits, k)  # 18 + 18 of 36 reserved


@pytest.mark.parametrize("concurrency", [3, None], ids=["with-a-lease", "tokens-only"])
async def test_the_call_a_stored_answer_turned_into_is_charged_its_tokens_once(
    concurrency: int | None,
) -> None:
    """What the call used is charged once, whether the stored answer held a lease of its own
    (a concurrency slot) or only its place in the request window (a key limiting only tokens)."""
    limits = policy(Clock(NOW))
    k = key(tokens_per_minute=40, max_concurrent_requests=concurrency)
    follower = await admit(limits, k, stored_answer=True)
    await _calls_after_all(follower)
    follower.settle(usage_record(api_key_id=k.id, input_tokens=2, output_tokens=2))
    assert await limits.flush()
    await admit(limits, k)  # 4 + 18 of 40
    await admit(limits, k)  # 4 + 36 of 40: the call's 4 counted once, its 18 given back
    with pytest.raises(RateLimited, match="tokens per minute"):
        await admit(limits, k)


async def test_a_stored_answer_needs_the_model_allowed() -> None:
    limits = policy(Clock(NOW))
    k = key(allowed_models=("other",), tokens_per_minute=18)
    with pytest.raises(ModelNotAllowed):
        await admit(limits, k, stored_answer=True)


def _record(k: AuthenticatedKey) -> Any:
    return usage_record(api_key_id=k.id, input_tokens=1, output_tokens=1, cost_usd=0.0)


class _FlakyStore(MemoryLimitStore):
    """Refuses the first settlement as an unreachable store would."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.down = True

    async def settle(self, charges: Any) -> None:
        if self.down:
            self.down = False
            raise ServiceUnavailable("down")
        await super().settle(charges)


async def test_a_settlement_the_store_refuses_is_sent_again() -> None:
    clock = Clock(NOW)
    store = _FlakyStore(clock)
    limits = LimitPolicy(store, PriceTable(), lease_seconds=30, clock=clock)
    k = key(max_concurrent_requests=1)
    (await admit(limits, k)).settle(None)
    assert not await limits.flush()
    assert await store.usage(f"concurrency:{k.id}") == (0.0, 1.0)  # the slot is still taken...
    await admit(limits, k)  # ...until the settlement got through, with the next admission


class _Counting(MemoryLimitStore):
    """Counts round trips; settlements (alone or riding along) can be held up by ``gate``."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.admissions = self.settlements = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.down = False

    async def admit(self, admission: Admission, settling: Sequence[Charge] = ()) -> Any:
        self.admissions += 1
        if self.down:
            raise ServiceUnavailable("down")
        if settling:
            await self.gate.wait()
        return await super().admit(admission, settling)

    async def settle(self, charges: Sequence[Charge]) -> None:
        self.settlements += 1
        await self.gate.wait()
        await super().settle(charges)


def counted(settle_seconds: float = 0.25) -> tuple[_Counting, LimitPolicy]:
    """A policy over a :class:`_Counting` store (no settler runs unless the test starts it)."""
    clock = Clock(NOW)
    store = _Counting(clock)
    return store, LimitPolicy(
        store, PriceTable(), lease_seconds=30, settle_seconds=settle_seconds, clock=clock
    )


async def test_a_release_rides_along_with_the_next_admission() -> None:
    store, limits = counted()
    k = key(max_concurrent_requests=1)
    for _ in range(5):  # one after another: each finds the slot its previous request held free
        (await admit(limits, k)).settle(_record(k))
    assert (store.admissions, store.settlements) == (5, 4)  # the last one is still queued
    assert await limits.flush()
    assert await store.usage(f"concurrency:{k.id}") == (0.0, 0.0)


async def test_an_idle_replica_sends_its_settlements_in_one_batch_after_a_while() -> None:
    store, limits = counted(settle_seconds=0.1)
    await limits.start()
    try:
        k = key(max_concurrent_requests=3)
        held = [await admit(limits, k) for _ in range(3)]
        for admitted in held:
            admitted.settle(None)
        await eventually(lambda: store.settlements == 1, what="the batch was sent")
        assert await store.usage(f"concurrency:{k.id}") == (0.0, 0.0)
        assert (store.admissions, store.settlements) == (3, 1)
    finally:
        await limits.close()


async def test_a_refusal_waits_for_the_release_on_its_way_and_asks_again() -> None:
    store, limits = counted()
    k = key(max_concurrent_requests=1)
    (await admit(limits, k)).settle(None)
    store.gate.clear()  # the release is held up on its way to the store
    flushing = asyncio.create_task(limits.flush())
    admitting = asyncio.create_task(admit(limits, k))
    await eventually(lambda: store.admissions == 2, what="the admission reached the store")
    assert not admitting.done()  # refused once: waiting for the release, not answering 429
    store.gate.set()
    assert await flushing
    await admitting
    assert store.admissions == 3
    with pytest.raises(RateLimited):
        await admit(limits, k)  # nothing on its way: refused at once
    assert store.admissions == 4


async def test_what_an_admission_carried_is_queued_again_if_it_fails() -> None:
    store, limits = counted()
    k = key(max_concurrent_requests=2)
    (await admit(limits, k)).settle(None)
    store.down = True
    with pytest.raises(ServiceUnavailable):
        await admit(limits, k)
    store.down = False
    assert await limits.flush()  # the release and the cut-off admission's cancellation
    assert await store.usage(f"concurrency:{k.id}") == (0.0, 0.0)
