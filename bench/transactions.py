"""``python -m bench.transactions``: the database transactions one ``serve`` process commits per
request at a steady load (issue 23, benchmark c).

``--rate`` requests a second (every other one streamed) for ``--seconds``, with two keys in turn:
one with only its request window, one with every limit (tokens per minute, a concurrency cap, a
subject's monthly budget). Counted as ``tests/test_quiet_database.py`` counts them: the database's
commits (``pg_stat_database.xact_commit``) from before the gateway starts until its connections
are gone, less the same gateway left idle for as long; and, from ``pg_stat_statements`` (preloaded
in the embedded server), which statements they were.
Target (issue 23): at most 1.1 transactions a request on the hot path plus 3 a second for the
ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from collections.abc import Sequence

import asyncpg
import uvloop

from bench.database import statement_deltas
from bench.one_process import World, world
from tests.test_quiet_database import a_key, committed, steady_load

_STATEMENTS = """
SELECT query, sum(calls)::bigint AS calls FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) GROUP BY query
"""
_SHOWN = 12


async def _statements(admin: asyncpg.Connection, database: str) -> dict[str, int]:
    """Calls by statement; none on a server that does not preload pg_stat_statements."""
    try:
        rows = await admin.fetch(_STATEMENTS, database)
    except asyncpg.ObjectNotInPrerequisiteStateError:
        return {}
    return {" ".join(row["query"].split())[:70]: row["calls"] for row in rows}


async def _run(
    lab: World, admin: asyncpg.Connection, key: str, rate: int, seconds: float
) -> tuple[int, int, dict[str, int]]:
    """(requests answered 200, commits, statements) from before a gateway starts until it is gone."""
    before = await committed(admin, lab.database)
    statements = await _statements(admin, lab.database)
    gateway, base = lab.start_gateway()
    try:
        await steady_load(base, key, 1, 1.0)  # as the test: the key looked up, one ledger row
        if rate:
            statuses = await steady_load(base, key, rate, seconds)
        else:
            statuses = []
            await asyncio.sleep(seconds)
    finally:
        gateway.stop()
    commits = await committed(admin, lab.database) - before
    ran = statement_deltas(statements, await _statements(admin, lab.database))
    refused = collections.Counter(status for status in statuses if status != 200)
    if refused:
        said = collections.Counter(
            line[line.find('"message"') :][:160]
            for line in gateway.log_path.read_text(errors="replace").splitlines()
            if '"level":"warn' in line or '"level":"error' in line
        )
        print(f"  not answered 200: {dict(refused)}; the gateway's warnings: {said.most_common(3)}")
    return statuses.count(200), commits, ran


async def _measure(lab: World, rate: int, seconds: float) -> None:
    admin = await asyncpg.connect(lab.admin_url)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for every_limit in (False, True):
            db = await lab.connect()
            try:
                key = await a_key(db, every_limit)
            finally:
                await db.close()
            _, idle, idle_ran = await _run(lab, admin, key, 0, seconds)
            answered, loaded, ran = await _run(lab, admin, key, rate, seconds)
            added = loaded - idle
            allowed = 1.1 * rate * seconds + 3 * seconds
            kind = "every limit" if every_limit else "request window only"
            print(
                f"key with {kind}: {answered} of {int(rate * seconds)} requests answered in "
                f"{seconds:g} s; {added} commits added ({loaded} with the load, {idle} idle): "
                f"{added / max(answered, 1):.2f} a request (target: at most {allowed:.0f}, "
                f"{'met' if added <= allowed else 'MISSED'})"
            )
            extra = statement_deltas(idle_ran, ran)
            for query, calls in sorted(extra.items(), key=lambda item: -item[1])[:_SHOWN]:
                print(f"  {calls / max(answered, 1):6.3f} a request  {query}")
    finally:
        await admin.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.transactions")
    parser.add_argument("--admin-url", help="a running PostgreSQL (default: an embedded one)")
    parser.add_argument("--rate", type=int, default=200, help="requests a second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nice", type=int, default=0, help="e.g. -10 on a shared machine")
    args = parser.parse_args(argv)
    with world(args.admin_url, chunks=5, chunk_delay=0.0, nice=args.nice) as lab:
        print(f"{args.rate} requests a second for {args.seconds:g} s, every other one streamed")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_measure(lab, args.rate, args.seconds))


if __name__ == "__main__":
    main()
