"""``python -m bench.admission``: admissions a second for one busy key, over simulated replicas.

Each replica is a process of its own with its own store and connections (a Postgres store holds
4, as in ``serve``), running ``--tasks`` admission loops on one key with a request window, a
concurrency cap, tokens per minute and a monthly budget, each admission followed by its
settlement (queued, and carried by the next admission, or sent by a background task after 0.25 s,
as the policy does). Measured for
1, 4 and 16 replicas (``--replicas``), on Postgres (a scratch database on ``--admin-url``,
migrated to head, dropped afterwards) and Redis (``--redis-url``), for two designs in the same
run: ``store`` (every admission is one round trip on the key's shared rows: the old path, the
floor), ``leases`` (``llmgw.limits.leases``: replicas admit from slices they took, every key) and
``default`` (the limits store ``serve`` makes with no setting changed: slices for a key once it is
busy on a replica, ``LIMIT_SLICE_BUSY_RATE``; it starts quiet, admitted by the store). Afterwards
every counter is checked against its cap (``used + reserved <= cap``). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

import asyncpg
import orjson

from bench.ledger_transactions import _scratch
from llmgw.config import Settings
from llmgw.errors import ServiceUnavailable
from llmgw.limits.leases import LeasedLimitStore
from llmgw.limits.postgres import PostgresLimitStore
from llmgw.limits.store import Admission, Charge, LimitStore, Reservation, Window
from llmgw.storage import migrations

_CONCURRENCY_CAP = 1_000  # above the replicas' requests in flight: the run measures admissions
_TOKENS_CAP, _TOKENS, _TOKENS_USED = 1e12, 2_000.0, 700.0
_BUDGET_CAP, _COST, _COST_USED = 1e9, 0.002, 0.0007
_WINDOW_LIMIT = 1_000_000_000
_SAMPLES = 20_000  # latencies each replica reports (evenly spread over its run)


def _reservations(key_id: uuid.UUID) -> tuple[Reservation, ...]:
    return (
        Reservation(f"budget:{key_id}:2026-12", _BUDGET_CAP, _COST, keep_seconds=3600),
        Reservation(f"concurrency:{key_id}", _CONCURRENCY_CAP, 1, keep_seconds=120),
        Reservation(f"tokens:{key_id}:0", _TOKENS_CAP, _TOKENS, keep_seconds=3600),
    )


async def _store(backend: str, url: str, prefix: str) -> LimitStore:
    if backend == "redis":
        from llmgw.limits.redis import RedisLimitStore

        return RedisLimitStore(url, key_prefix=prefix)
    return PostgresLimitStore(await asyncpg.create_pool(url, min_size=1, max_size=1), url)


async def _replica(
    backend: str,
    url: str,
    prefix: str,
    key_id: uuid.UUID,
    design: str,
    tasks: int,
    slice_requests: int,
) -> None:
    """One replica: wait for a line on stdin, admit for as long as it says (seconds), print JSON."""
    store = await _store(backend, url, prefix)
    if design == "leases":  # every key takes slices
        store = LeasedLimitStore(store, slice_requests=slice_requests)
    elif design == "default":  # as ``serve`` makes it with no setting changed
        defaults = Settings()
        store = LeasedLimitStore(
            store,
            slice_requests=defaults.limit_slice_requests,
            slice_seconds=defaults.limit_slice_seconds,
            busy_rate=defaults.limit_slice_busy_rate,
        )
    await store.start()
    window = Window(key_id, _WINDOW_LIMIT, 60)
    reservations = _reservations(key_id)
    actuals = {
        r.counter: a for r, a in zip(reservations, (_COST_USED, 0.0, _TOKENS_USED), strict=True)
    }
    # Every statement prepared and every connection open before the clock starts.
    for _ in range(tasks):
        warm = Admission(uuid.uuid4(), 60.0, window, reservations)
        await store.admit(warm)
        await store.settle([Charge(warm.lease_id, c, 0.0) for c in actuals])
    print("ready", flush=True)
    seconds = float(await asyncio.to_thread(sys.stdin.readline))
    cpu = time.process_time()
    queue: list[Charge] = []
    latencies: list[float] = []
    counts = {"admitted": 0, "refused": 0, "unavailable": 0}
    deadline = time.perf_counter() + seconds

    async def admitting() -> None:
        while time.perf_counter() < deadline:
            admission = Admission(uuid.uuid4(), 60.0, window, reservations)
            # What is queued rides along, as the policy sends it (settled first, same round trip).
            carried = queue.copy()
            queue.clear()
            started = time.perf_counter()
            try:
                result = await store.admit(admission, carried)
            except ServiceUnavailable:  # the store's 2 s bound: a 503 in the gateway
                latencies.append(time.perf_counter() - started)
                counts["unavailable"] += 1
                queue[:0] = carried
                continue
            latencies.append(time.perf_counter() - started)
            if result.admitted:
                counts["admitted"] += 1
                queue.extend(Charge(admission.lease_id, c, a) for c, a in actuals.items())
            else:
                counts["refused"] += 1
            # A real request waits on its sockets: the settling task gets its turn, as it does
            # in the gateway (an admission from a slice itself never waits).
            await asyncio.sleep(0)

    async def settling() -> None:
        """What no admission carried, sent on its own every 0.25 s (an idle replica's)."""
        while time.perf_counter() < deadline or queue:
            if queue:
                batch = queue.copy()
                queue.clear()
                try:
                    await store.settle(batch)
                except ServiceUnavailable:
                    queue[:0] = batch  # sent again, as the policy does
            await asyncio.sleep(0.25)

    await asyncio.gather(settling(), *(admitting() for _ in range(tasks)))
    cpu = time.process_time() - cpu
    await store.close()
    step = max(1, len(latencies) // _SAMPLES)
    print(orjson.dumps({**counts, "cpu": cpu, "latencies": latencies[::step]}).decode(), flush=True)


def _percentile(values: Sequence[float], share: float) -> float:
    return values[min(len(values) - 1, int(share * len(values)))] if values else float("nan")


def _measure(
    backend: str, url: str, key_id: uuid.UUID, design: str, replicas: int, args: argparse.Namespace
) -> dict[str, float]:
    prefix = f"llmgw-bench:{uuid.uuid4().hex}"
    command = [sys.executable, "-m", "bench.admission", "--child", backend, url, prefix,
               str(key_id), design, str(args.tasks), str(args.slice_requests)]  # fmt: skip
    commits = asyncio.run(_commits(url)) if backend == "postgres" else 0
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(replicas)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(f"{args.seconds}\n")
            child.stdin.flush()
        reports = [orjson.loads(child.stdout.readline()) for child in children if child.stdout]
    finally:
        for child in children:
            if child.wait(timeout=60) != 0:
                raise SystemExit(f"a replica failed ({backend}, {design}, {replicas})")
    latencies = sorted(x for report in reports for x in report["latencies"])
    if backend == "postgres":  # read once every replica's connections are gone (stats flushed)
        commits = asyncio.run(_commits(url)) - commits
    over = asyncio.run(_over_cap(backend, url, prefix, key_id))
    admitted = sum(report["admitted"] for report in reports)
    return {
        "admitted_per_s": admitted / args.seconds,
        "refused": sum(report["refused"] for report in reports),
        "unavailable": sum(report["unavailable"] for report in reports),
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "over_cap": over,
        "cpu_us": sum(report["cpu"] for report in reports) / max(1, admitted) * 1e6,
        "commits_per_1k": commits / max(1, admitted) * 1000 if backend == "postgres" else 0.0,
    }


async def _commits(database_url: str) -> int:
    """The database's committed transactions so far (every store statement is one)."""
    connection = await asyncpg.connect(database_url)
    try:
        commits: int = await connection.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return commits
    finally:
        await connection.close()


async def _over_cap(backend: str, url: str, prefix: str, key_id: uuid.UUID) -> int:
    """How many of the key's counters hold more than their cap (used + reserved)."""
    store = await _store(backend, url, prefix)
    await store.start()
    try:
        over = 0
        for reservation in _reservations(key_id):
            used, reserved = await store.usage(reservation.counter)
            over += used + reserved > reservation.cap
        return over
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.admission")
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--backends", default="postgres,redis")
    parser.add_argument("--designs", default="store,leases,default")
    parser.add_argument("--replicas", default="1,4,16")
    parser.add_argument("--tasks", type=int, default=4, help="admission loops per replica")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--slice-requests", type=int, default=64, help="LIMIT_SLICE_REQUESTS of the leases design"
    )
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        backend, url, prefix, key, design, tasks, slices = args.child
        asyncio.run(_replica(backend, url, prefix, uuid.UUID(key), design, int(tasks), int(slices)))
        return
    name = f"llmgw_bench_admission_{uuid.uuid4().hex[:8]}"
    database_url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    asyncio.run(_scratch(args.admin_url, name, create=True))
    try:
        migrations.upgrade(database_url)
        key_id = asyncio.run(_new_key(database_url))
        print(f"one key, {args.tasks} admission loops a replica, {args.seconds:g} s each, "
              f"{os.cpu_count()} cores, leases with LIMIT_SLICE_REQUESTS={args.slice_requests}\n")  # fmt: skip
        print("| backend | design | replicas | admissions/s | p50 ms | p99 ms | refused | 503 | "
              "counters over cap | replicas' CPU µs / admission | commits / 1k admissions | "
              "load average |\n|---|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
        for backend in args.backends.split(","):
            url = database_url if backend == "postgres" else args.redis_url
            for replicas in (int(n) for n in args.replicas.split(",")):
                for design in args.designs.split(","):
                    m = _measure(backend, url, key_id, design, replicas, args)
                    print(f"| {backend} | {design} | {replicas} | {m['admitted_per_s']:,.0f} | "
                          f"{m['p50_ms']:.2f} | {m['p99_ms']:.1f} | {m['refused']:.0f} | "
                          f"{m['unavailable']:.0f} | "
                          f"{m['over_cap']:.0f} | {m['cpu_us']:.0f} | "
                          f"{m['commits_per_1k']:.1f} | {os.getloadavg()[0]:.1f} |",
                          flush=True)  # fmt: skip
    finally:
        asyncio.run(_scratch(args.admin_url, name, create=False))


async def _new_key(database_url: str) -> uuid.UUID:
    """The old path counts windows in a table that refers to the key."""
    connection = await asyncpg.connect(database_url)
    try:
        key_id: uuid.UUID = await connection.fetchval(
            "INSERT INTO api_keys (name, prefix, key_hash) VALUES ('bench', $1, $2) RETURNING id",
            "llmg_" + uuid.uuid4().hex[:7],
            os.urandom(32),
        )
        return key_id
    finally:
        await connection.close()


if __name__ == "__main__":
    main()
