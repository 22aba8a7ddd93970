"""A provider's connection slots: taken at once while free, handed to a waiter when one is given
back, and a full pool refuses with 503 upstream_busy by the deadline instead of queueing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llmgw.errors import UpstreamBusy
from llmgw.providers.pool import RETRY_AFTER_SECONDS, ConnectionPool
from tests.processes import eventually

LATER = 3600.0  # a deadline no test reaches: the waits end by what the test does


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_free_slots_are_taken_at_once_and_given_back_once() -> None:
    pool = ConnectionPool("venice", 2)
    first = await pool.acquire(now() + LATER)
    second = await pool.acquire(now() + LATER)
    assert (pool.in_use, pool.waiting) == (2, 0)
    first.release()
    first.release()  # however often asked
    assert pool.in_use == 1
    third = await pool.acquire(now())  # the slot given back: no wait needed, even at the deadline
    assert pool.in_use == 2
    second.release()
    third.release()
    assert pool.in_use == 0


async def test_a_waiter_gets_the_slot_given_back() -> None:
    pool = ConnectionPool("venice", 1, wait_seconds=LATER)
    held = await pool.acquire(now() + LATER)
    waiter = asyncio.create_task(pool.acquire(now() + LATER))
    await eventually(lambda: pool.waiting == 1)
    held.release()
    slot = await waiter
    assert (pool.in_use, pool.waiting) == (1, 0)
    slot.release()


async def test_a_full_pool_refuses_at_the_deadline_with_503_and_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llmgw.providers.pool")
    pool = ConnectionPool("venice", 1, wait_seconds=LATER)
    held = await pool.acquire(now() + LATER)
    for _ in range(3):
        with pytest.raises(UpstreamBusy) as refused:
            await pool.acquire(now())  # the caller's deadline, not the pool's wait, ends it
        assert refused.value.status == 503 and refused.value.code == "upstream_busy"
        assert refused.value.headers == {"Retry-After": str(RETRY_AFTER_SECONDS)}
    assert (pool.in_use, pool.waiting) == (1, 0)
    # A storm of refusals is one warning a minute, not one a call.
    [warning] = caplog.records
    assert "venice: all 1 connections in use" in warning.getMessage()
    held.release()
