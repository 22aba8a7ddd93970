"""The bound on request-body bytes held at once: served in order, a brief wait, then a 503."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.body_memory import BodyAllowance, BodyLimit, BodyMemory
from llmgw.errors import PayloadTooLarge, ServiceUnavailable

WAIT = 0.2


async def test_a_body_that_fits_is_granted_at_once_and_given_back() -> None:
    memory = BodyMemory(100, wait_seconds=WAIT)
    await memory.acquire(60)
    await memory.acquire(40)
    assert memory.free == 0
    memory.release(60)
    memory.release(40)
    assert memory.free == 100


async def test_a_waiter_is_granted_when_memory_is_released_within_the_wait() -> None:
    memory = BodyMemory(100, wait_seconds=WAIT)
    await memory.acquire(80)
    waiting = asyncio.create_task(memory.acquire(50))
    await asyncio.sleep(0)
    assert not waiting.done()
    memory.release(80)
    await waiting
    assert memory.free == 50


async def test_past_the_wait_a_503_with_retry_after_and_nothing_held() -> None:
    memory = BodyMemory(100, wait_seconds=WAIT)
    await memory.acquire(80)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ServiceUnavailable) as caught:
        await memory.acquire(50)
    assert WAIT <= loop.time() - started < WAIT + 0.5
    assert caught.value.status == 503
    assert caught.value.code == "request_bodies_busy"
    assert caught.value.headers == {"Retry-After": "2"}
    assert "REQUEST_BODY_MEMORY_BYTES" in caught.value.message
    memory.release(80)
    assert memory.free == 100, "the refused request holds nothing"


async def test_waiters_are_served_in_arrival_order() -> None:
    memory = BodyMemory(100, wait_seconds=WAIT)
    await memory.acquire(100)
    granted: list[str] = []

    async def take(name: str, size: int) -> None:
        await memory.acquire(size)
        granted.append(name)

    large = asyncio.create_task(take("large", 90))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 10))
    await asyncio.sleep(0)
    memory.release(50)  # enough for the small one, which must not overtake the large one
    await asyncio.sleep(0)
    assert granted == []
    memory.release(50)
    await asyncio.gather(large, small)
    assert granted == ["large", "small"]


async def test_a_waiter_that_leaves_lets_the_ones_behind_it_in() -> None:
    memory = BodyMemory(100, wait_seconds=WAIT)
    await memory.acquire(60)
    large = asyncio.create_task(memory.acquire(90))
    await asyncio.sleep(0)
    small = asyncio.create_task(memory.acquire(30))
    await asyncio.sleep(0)
    large.cancel()  # its client went away
    await small
    assert memory.free == 10


async def test_a_declared_body_reserves_its_size_and_one_arriving_reserves_in_steps() -> None:
    memory = BodyMemory(8 << 20, wait_seconds=WAIT)
    declared = BodyAllowance(BodyLimit(3 << 20, "REQUEST_BODY_LIMIT_BYTES"), memory)
    await declared.hold(500)
    assert declared.reserved == 500, "a small body holds what it is, not a step"
    declared.release()
    allowance = BodyAllowance(BodyLimit(3 << 20, "MESSAGES_BODY_LIMIT_BYTES"), memory)
    await allowance.hold(10, arriving=True)  # a chunked body's first bytes reserve a step
    assert allowance.reserved == 1 << 20
    await allowance.hold(2 << 20, arriving=True)
    assert allowance.reserved == 2 << 20
    with pytest.raises(PayloadTooLarge) as caught:
        await allowance.hold((3 << 20) + 1, arriving=True)
    assert caught.value.message == (
        "Request body is larger than the limit of 3145728 bytes (MESSAGES_BODY_LIMIT_BYTES)."
    )
    allowance.release()
    assert (allowance.reserved, memory.free) == (0, 8 << 20)


async def test_a_body_larger_than_the_whole_bound_is_read_alone() -> None:
    memory = BodyMemory(1000, wait_seconds=WAIT)
    allowance = BodyAllowance(BodyLimit(5000, "REQUEST_BODY_LIMIT_BYTES"), memory)
    await allowance.hold(4000)
    assert (allowance.reserved, memory.free) == (1000, 0)
    await allowance.hold(5000)  # holds all there is already: no wait for more
    allowance.release()
    assert memory.free == 1000
