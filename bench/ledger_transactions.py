"""``python -m bench.ledger_transactions``: the usage ledger's transactions per second at a load.

Requests finish at a steady rate (``--rate`` a second, for ``--seconds``); each queues its row with
``UsageLedger.record``, as the pipeline does, and the ledger's background writer (its defaults:
every 0.5 s or 500 rows) writes them to a real PostgreSQL: a scratch database on
``--admin-url`` (default the local server), migrated to head and dropped afterwards. Counted:
the ledger's batch transactions (each ``write_batch`` is one), and the database's own commits
(``pg_stat_database.xact_commit``) over the run. docs/accounting.md (the usage ledger) documents
about two a second.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import Sequence

import asyncpg

from bench.ledger_spool import _record
from llmgw.accounting.usage import UsageRecord
from llmgw.storage import ledger as ledger_module
from llmgw.storage import migrations
from llmgw.storage.ledger import UsageLedger
from llmgw.storage.usage import write_batch

_TICK_SECONDS = 0.01
_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


async def _run(database_url: str, rate: int, seconds: float) -> tuple[int, int, int]:
    """(rows written, ledger transactions, database commits) over the run."""
    batches = 0

    async def counted(connection: asyncpg.Connection, records: Sequence[UsageRecord]) -> None:
        nonlocal batches
        batches += 1
        await write_batch(connection, records)

    ledger_module.write_batch = counted  # type: ignore[assignment]  # the bench's own counter
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    observer = await asyncpg.connect(database_url)
    try:
        await observer.execute("SELECT pg_stat_clear_snapshot()")
        commits_before = await observer.fetchval(_COMMITS)
        ledger = UsageLedger(pool)
        await ledger.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        recorded = 0
        while (elapsed := loop.time() - started) < seconds:
            due = int(elapsed * rate)
            for index in range(recorded, due):
                ledger.record(_record(index))
            recorded = due
            await asyncio.sleep(_TICK_SECONDS)
        await ledger.close()
        await asyncio.sleep(1.0)  # the statistics of the last commits reach pg_stat_database
        await observer.execute("SELECT pg_stat_clear_snapshot()")
        commits = await observer.fetchval(_COMMITS) - commits_before
        written = await observer.fetchval("SELECT count(*) FROM usage_events")
    finally:
        await observer.close()
        await pool.close()
    return written, batches, commits


async def _scratch(admin_url: str, name: str, *, create: bool) -> None:
    connection = await asyncpg.connect(admin_url)
    try:
        if create:
            await connection.execute(f'CREATE DATABASE "{name}"')
        else:
            await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_transactions")
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rate", type=int, default=700, help="requests finished per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    name = f"llmgw_bench_ledger_{uuid.uuid4().hex[:8]}"
    database_url = args.admin_url.rsplit("/", 1)[0] + "/" + name
    asyncio.run(_scratch(args.admin_url, name, create=True))
    try:
        migrations.upgrade(database_url)
        written, batches, commits = asyncio.run(_run(database_url, args.rate, args.seconds))
    finally:
        asyncio.run(_scratch(args.admin_url, name, create=False))
    print(
        f"{args.rate} requests/s for {args.seconds:g} s: {written} rows written in {batches} "
        f"ledger transactions ({batches / args.seconds:.1f}/s, {written / max(batches, 1):.0f} "
        f"rows each); the database counted {commits} commits (the last flush's and the pool's "
        "own included)"
    )


if __name__ == "__main__":
    main()
