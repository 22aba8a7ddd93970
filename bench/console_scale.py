"""``python -m bench.console_scale``: the console's pages against a ledger of 1,000,000 rows.

Makes a throwaway database (embedded PostgreSQL in a temp dir, or ``--database-url``'s server),
fills ``usage_events`` with ``--rows`` requests spread over 30 days (200 keys, 50 subjects, 20
models) at the schema revision before the rollup existed, migrates to head (the migration backfills
the hourly rollup, as an upgrade in production would), then signs in to a real gateway's console
and times every API call its pages make: the median and the worst of ``--repeat`` runs each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg
from aiohttp.test_utils import TestServer

from llmgw.app import create_app
from llmgw.config import Settings, venice_provider
from llmgw.storage import migrations
from llmgw.storage.embedded import start_embedded

ADMIN_TOKEN = "bench-console-admin-token-0123456789"  # noqa: S105 (a throwaway database)
_KEYS, _SUBJECTS, _MODELS = 200, 50, 20

_FILL = """
INSERT INTO usage_events (
    occurred_at, api_key_id, subject_id, request_id, operation, provider, model, stream, status,
    input_tokens, output_tokens, cost_usd, duration_ms
)
SELECT $1::timestamptz - (i % (30 * 86400)) * interval '1 second',
       keys.ids[1 + i % $2], subjects.ids[1 + (i % $2) % $3],
       'bench-' || i, 'chat', 'venice', 'model-' || (i % $4), i % 3 = 0,
       CASE WHEN i % 50 = 0 THEN 502 ELSE 200 END,
       50 + i % 900, 10 + i % 400, (i % 1000) * 0.000001, 20 + (i % 5000) * 0.7
FROM generate_series(1, $5) AS i,
     (SELECT array_agg(id ORDER BY id) AS ids FROM api_keys) AS keys,
     (SELECT array_agg(gen_random_uuid()) AS ids FROM generate_series(1, $3)) AS subjects
"""


async def _fill(url: str, rows: int) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.executemany(
            "INSERT INTO api_keys (name, prefix, key_hash) VALUES ($1, $2, $3)",
            [
                (f"bench-{n}", f"llmg_b{n:06d}", uuid.uuid4().bytes + uuid.uuid4().bytes)
                for n in range(_KEYS)
            ],
        )
        await connection.execute(_FILL, datetime.now(UTC), _KEYS, _SUBJECTS, _MODELS, rows)
        await connection.execute("ANALYZE")
    finally:
        await connection.close()


async def _time_console(url: str, repeat: int) -> list[tuple[str, float, float]]:
    settings = Settings(
        database_url=url, environment_provider=venice_provider("unused"), admin_token=ADMIN_TOKEN
    )
    server = TestServer(create_app(settings, database_url=url), host="127.0.0.1")
    await server.start_server()
    today = datetime.now(UTC).date()
    month_ago = today - timedelta(days=30)
    report = f"from={month_ago}&to={today + timedelta(days=1)}"
    calls = {
        "Overview": "/console/api/overview",
        "Keys (first page)": "/console/api/keys?limit=25&offset=0&state=all",
        "Keys (last page)": f"/console/api/keys?limit=25&offset={_KEYS - 25}&state=all",
        "Subjects": "/console/api/subjects?limit=100",
        "Usage by day, 30 days": f"/console/api/usage/report?by=day&{report}",
        "Usage by model, 30 days": f"/console/api/usage/report?by=model&{report}",
        "Usage by key, 30 days": f"/console/api/usage/report?by=key&{report}",
        "Usage by subject, 30 days": f"/console/api/usage/report?by=subject&{report}",
        "Usage CSV by key, 30 days": f"/console/api/usage/report?by=key&{report}&format=csv",
        "Audit": "/console/api/audit?limit=50",
        "Console page": "/console/",
    }
    timings = []
    try:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as session:
            async with session.post(
                server.make_url("/console/sign-in"), data={"token": ADMIN_TOKEN}
            ) as response:
                assert response.status == 200, response.status
            for name, path in calls.items():
                seconds = []
                for _ in range(repeat + 1):  # the first run warms caches and is not counted
                    started = time.perf_counter()
                    async with session.get(server.make_url(path)) as response:
                        await response.read()
                        assert response.status == 200, (path, response.status)
                    seconds.append(time.perf_counter() - started)
                timings.append((name, statistics.median(seconds[1:]), max(seconds[1:])))
    finally:
        await server.close()
    return timings


async def _run(url: str, rows: int, repeat: int) -> list[tuple[str, float, float]]:
    await asyncio.to_thread(migrations.upgrade, url, "0003")
    started = time.perf_counter()
    await _fill(url, rows)
    filled = time.perf_counter() - started
    started = time.perf_counter()
    await asyncio.to_thread(migrations.upgrade, url)
    print(f"filled {rows:,} rows in {filled:.1f}s; migrating to head (rollup backfill) took "
          f"{time.perf_counter() - started:.1f}s")  # fmt: skip
    connection = await asyncpg.connect(url)
    try:
        hourly = await connection.fetchval("SELECT count(*) FROM usage_hourly")
    finally:
        await connection.close()
    print(f"usage_hourly: {hourly:,} rows")
    return await _time_console(url, repeat)


async def _with_database(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    name = f"llmgw_console_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.database_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = args.database_url.rsplit("/", 1)[0] + "/" + name
    try:
        return await _run(url, args.rows, args.repeat)
    finally:
        admin = await asyncpg.connect(args.database_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_scale", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", help="a server to make a throwaway database on")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-console-bench-") as data_dir:
        if args.database_url is None:
            Path(data_dir).chmod(0o755)
            args.database_url = start_embedded(Path(data_dir))
        timings = asyncio.run(_with_database(args))
    print(f"\n{'console call':<28} {'median ms':>10} {'worst ms':>10}")
    for name, median, worst in timings:
        print(f"{name:<28} {median * 1000:>10.1f} {worst * 1000:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
