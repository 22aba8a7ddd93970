"""Provider account caps on the in-memory limits store, with a clock the test holds."""

from __future__ import annotations

import orjson
import pytest

from llmgw.limits.caps import AccountCap, CapHold, ProviderCaps
from llmgw.limits.memory import MemoryLimitStore
from tests.routing.test_policy import Clock

# A minute starts at a multiple of 60 s; the clock starts 10 s into one.
MINUTE_START = 1_000_020.0


def body(max_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x" * 40}],
            "max_tokens": max_tokens,
        }
    )


async def fits(caps: ProviderCaps, provider: str, cap: AccountCap, sent: bytes) -> bool:
    return isinstance(await caps.take(provider, cap, sent), CapHold)


def caps_on(
    clock: Clock, store: MemoryLimitStore | None = None, **caps: AccountCap
) -> ProviderCaps:
    store = store or MemoryLimitStore(clock=clock)
    counted = ProviderCaps(clock=clock)
    counted.configure(caps)
    counted.use(store, default_max_output_tokens=100)
    return counted


async def test_rpm_admits_its_requests_in_a_minute_then_refuses_until_the_next() -> None:
    clock = Clock(MINUTE_START + 10)
    caps = caps_on(clock, venice=AccountCap(rpm=2))
    cap = caps.of("venice")
    assert cap is not None
    assert await fits(caps, "venice", cap, body(10))
    assert await fits(caps, "venice", cap, body(10))
    assert await caps.take("venice", cap, body(10)) == pytest.approx(50.0)
    clock.now = MINUTE_START + 59.5
    assert await caps.take("venice", cap, body(10)) == pytest.approx(0.5)
    clock.now = MINUTE_START + 60
    assert await fits(caps, "venice", cap, body(10))


async def test_tpm_counts_each_requests_worst_case_and_a_refusal_counts_nothing() -> None:
    clock = Clock(MINUTE_START)
    store = MemoryLimitStore(clock=clock)
    caps = caps_on(clock, store, venice=AccountCap(rpm=100, tpm=1000))
    cap = caps.of("venice")
    assert cap is not None
    # Each: about 20 input tokens (the serialized messages) and at most 400 output.
    assert await fits(caps, "venice", cap, body(400))
    assert await fits(caps, "venice", cap, body(400))
    assert not await fits(caps, "venice", cap, body(400))
    # Smaller ones still fit; the refused one took no request from rpm either.
    assert await fits(caps, "venice", cap, body(100))
    used, reserved = await store.usage(f"provider-requests:venice:{MINUTE_START:.0f}")
    assert used + reserved == 3


async def test_a_request_larger_than_the_whole_minute_goes_when_the_minute_is_empty() -> None:
    clock = Clock(MINUTE_START)
    caps = caps_on(clock, venice=AccountCap(tpm=50))
    cap = caps.of("venice")
    assert cap is not None
    assert await fits(caps, "venice", cap, body(4000))
    assert not await fits(caps, "venice", cap, body(1))


async def test_a_provider_without_caps_or_without_a_store_is_never_counted() -> None:
    clock = Clock(MINUTE_START)
    caps = caps_on(clock, venice=AccountCap(rpm=1), local=AccountCap())
    assert caps.of("local") is None
    assert caps.of("openai") is None
    unstarted = ProviderCaps(clock=clock)
    unstarted.configure({"venice": AccountCap(rpm=1)})
    assert unstarted.of("venice") is None


async def test_caps_are_per_provider() -> None:
    clock = Clock(MINUTE_START)
    caps = caps_on(clock, venice=AccountCap(rpm=1), openai=AccountCap(rpm=1))
    venice, openai = caps.of("venice"), caps.of("openai")
    assert venice is not None and openai is not None
    assert await fits(caps, "venice", venice, body(1))
    assert not await fits(caps, "venice", venice, body(1))
    assert await fits(caps, "openai", openai, body(1))


async def test_a_settled_request_leaves_the_minute_only_what_it_used() -> None:
    clock = Clock(MINUTE_START)
    store = MemoryLimitStore(clock=clock)
    caps = caps_on(clock, store, venice=AccountCap(rpm=100, tpm=1000))
    cap = caps.of("venice")
    assert cap is not None
    hold = await caps.take("venice", cap, body(900))
    assert isinstance(hold, CapHold)
    assert not await fits(caps, "venice", cap, body(900))  # its worst case is held
    charge = hold.charge(35)
    assert charge is not None
    await store.settle([charge])
    counter = f"provider-tokens:venice:{MINUTE_START:.0f}"
    assert await store.usage(counter) == (35, 0)
    assert await fits(caps, "venice", cap, body(900))  # what it did not use is free again
    rpm_only = caps_on(clock, store, local=AccountCap(rpm=5))
    local = rpm_only.of("local")
    assert local is not None
    held = await rpm_only.take("local", local, body(10))
    assert isinstance(held, CapHold)
    assert held.charge(10) is None  # no tpm: nothing to settle, the request stays counted
