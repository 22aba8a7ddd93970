"""Provider account caps on the in-memory limits store, with a clock the test holds."""

from __future__ import annotations

import orjson
import pytest

from llmgw.limits.memory import MemoryLimitStore
from llmgw.routing.caps import AccountCap, ProviderCaps
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
    assert await caps.take("venice", cap, body(10)) is None
    assert await caps.take("venice", cap, body(10)) is None
    assert await caps.take("venice", cap, body(10)) == pytest.approx(50.0)
    clock.now = MINUTE_START + 59.5
    assert await caps.take("venice", cap, body(10)) == pytest.approx(0.5)
    clock.now = MINUTE_START + 60
    assert await caps.take("venice", cap, body(10)) is None


async def test_tpm_counts_each_requests_worst_case_and_a_refusal_counts_nothing() -> None:
    clock = Clock(MINUTE_START)
    store = MemoryLimitStore(clock=clock)
    caps = caps_on(clock, store, venice=AccountCap(rpm=100, tpm=1000))
    cap = caps.of("venice")
    assert cap is not None
    # Each: about 20 input tokens (the serialized messages) and at most 400 output.
    assert await caps.take("venice", cap, body(400)) is None
    assert await caps.take("venice", cap, body(400)) is None
    assert await caps.take("venice", cap, body(400)) is not None
    # Smaller ones still fit; the refused one took no request from rpm either.
    assert await caps.take("venice", cap, body(100)) is None
    used, reserved = await store.usage(f"provider-requests:venice:{MINUTE_START:.0f}")
    assert used + reserved == 3


async def test_a_request_larger_than_the_whole_minute_goes_when_the_minute_is_empty() -> None:
    clock = Clock(MINUTE_START)
    caps = caps_on(clock, venice=AccountCap(tpm=50))
    cap = caps.of("venice")
    assert cap is not None
    assert await caps.take("venice", cap, body(4000)) is None
    assert await caps.take("venice", cap, body(1)) is not None


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
    assert await caps.take("venice", venice, body(1)) is None
    assert await caps.take("venice", venice, body(1)) is not None
    assert await caps.take("openai", openai, body(1)) is None
