"""Background tasks stop together, and each has finished its own cleanup when the call returns."""

from __future__ import annotations

import asyncio

from llmgw.background import cancel_and_wait


async def test_every_task_is_cancelled_and_has_ended_when_it_returns() -> None:
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            cleaned.append(name)

    tasks = [asyncio.create_task(forever(name)) for name in ("a", "b")]
    await asyncio.sleep(0)
    await cancel_and_wait([tasks[0], None, tasks[1]])
    assert all(task.done() and task.cancelled() for task in tasks)
    assert sorted(cleaned) == ["a", "b"]
