"""Stopping the gateway's background tasks (listeners, refreshers, settlement loops)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task, then wait until each has ended, so none runs on after its owner closed.

    All are cancelled before the first is awaited: they stop together, not one after another.
    """
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError):
            await task
