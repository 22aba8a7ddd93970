"""A replica for the capacity-lease contract tests: ``python -m tests.limits.replica BACKEND URL
PREFIX KEY ATTEMPTS`` starts its own :class:`LeasedLimitStore` and connections and prints
``ready``; at a line on stdin it admits ATTEMPTS requests at once for one key (window,
concurrency, tokens, budget), prints how many it got and holds them (never settled); at the next
line it cancels them, closes (giving its slices back), prints ``closed`` and exits. A test may
SIGKILL it while it holds."""

from __future__ import annotations

import asyncio
import sys
import uuid

from llmgw.limits.leases import LeasedLimitStore
from llmgw.limits.store import Admission, LimitStore, Reservation, Window

SLICE_SECONDS = 2.0
CONCURRENCY_CAP = 20
TOKENS_CAP, TOKENS = 1000.0, 30.0
BUDGET_CAP, COST = 10.0, 0.25
WINDOW_LIMIT = 1000


def admission(key_id: uuid.UUID) -> Admission:
    reservations = (
        Reservation(f"budget:{key_id}:2026-12", BUDGET_CAP, COST, keep_seconds=120),
        Reservation(f"concurrency:{key_id}", CONCURRENCY_CAP, 1, keep_seconds=120),
        Reservation(f"tokens:{key_id}:0", TOKENS_CAP, TOKENS, keep_seconds=120),
    )
    return Admission(uuid.uuid4(), 60.0, Window(key_id, WINDOW_LIMIT, 60), reservations)


async def _store(backend: str, url: str, prefix: str) -> LimitStore:
    if backend == "redis":
        from llmgw.limits.redis import RedisLimitStore

        return RedisLimitStore(url, key_prefix=prefix)
    import asyncpg

    from llmgw.limits.postgres import PostgresLimitStore

    return PostgresLimitStore(await asyncpg.create_pool(url, min_size=1, max_size=1), url)


async def main(backend: str, url: str, prefix: str, key_id: uuid.UUID, attempts: int) -> None:
    leased = LeasedLimitStore(
        await _store(backend, url, prefix), slice_seconds=SLICE_SECONDS, tick_seconds=0.05
    )
    await leased.start()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    requests = [admission(key_id) for _ in range(attempts)]
    results = await asyncio.gather(*(leased.admit(r) for r in requests))
    held = [(r.lease_id, tuple(x.counter for x in r.reservations)) for r, result in
            zip(requests, results, strict=True) if result.admitted]  # fmt: skip
    print(len(held), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await leased.cancel(held, 60.0)
    await leased.close()
    print("closed", flush=True)


if __name__ == "__main__":
    backend, url, prefix, key, attempts = sys.argv[1:]
    asyncio.run(main(backend, url, prefix, uuid.UUID(key), int(attempts)))
