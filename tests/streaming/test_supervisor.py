"""The bounds of every relayed stream: its maximum duration, the deadline a shutdown brings
forward, and the usage drains a shutdown waits for."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.errors import ServiceUnavailable, UpstreamTimeout
from llmgw.streaming.supervisor import StreamSupervisor

FOREVER = 3600.0


def supervisor(*, max_seconds: float = FOREVER, grace: float = 0.0) -> StreamSupervisor:
    return StreamSupervisor(
        max_seconds=max_seconds, max_event_bytes=1 << 20, shutdown_grace_seconds=grace
    )


async def test_a_stream_past_its_maximum_duration_ends_with_504() -> None:
    streams = supervisor(max_seconds=0)
    with pytest.raises(UpstreamTimeout) as ended:
        async with streams.bounded():
            await asyncio.Event().wait()
    assert (ended.value.status, ended.value.code) == (504, "stream_max_duration")


async def test_a_shutdown_ends_open_streams_by_its_grace_and_later_ones_at_once() -> None:
    streams = supervisor(grace=0.0)  # within the margin: their deadline is now
    started = asyncio.Event()

    async def stream() -> None:
        async with streams.bounded():
            started.set()
            await asyncio.Event().wait()

    open_stream = asyncio.create_task(stream())
    await started.wait()
    assert not streams.shutdown_cut()
    streams.begin_shutdown()
    with pytest.raises(ServiceUnavailable) as ended:
        await asyncio.wait_for(open_stream, 10)  # a bound, should the deadline not move
    assert (ended.value.status, ended.value.code) == (503, "gateway_shutting_down")
    assert streams.shutdown_cut()
    with pytest.raises(ServiceUnavailable):
        await stream()  # one that opens during the shutdown gets no more time


async def test_a_stream_that_ends_by_itself_is_untouched_and_other_timeouts_pass_through() -> None:
    streams = supervisor()
    async with streams.bounded():
        pass
    with pytest.raises(TimeoutError):  # the body's own timeout, not the stream's deadline
        async with streams.bounded(), asyncio.timeout(0):
            await asyncio.Event().wait()


async def test_shutdown_waits_for_the_usage_drains() -> None:
    streams = supervisor()
    release, done = asyncio.Event(), []

    async def drain() -> None:
        await release.wait()
        done.append(True)

    streams.drain(drain())
    waiting = asyncio.create_task(streams.wait_for_drains())
    await asyncio.sleep(0)  # let it start waiting
    assert not waiting.done()
    release.set()
    await waiting
    assert done == [True]
