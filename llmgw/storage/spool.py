"""The usage ledger's spool: each queued record is also appended to a file of this process, so a
process killed before its batch reached the database (SIGKILL, the OOM killer) loses no row.

One directory per database. A process holds an exclusive ``flock`` on ``<token>.lock`` for its
whole life and appends one JSON line per record to segments ``<token>.<n>.jsonl``; the ledger
starts a new segment at each flush and deletes the older ones once their rows are written. A lock
that can be taken belongs to a process that is gone (the kernel releases it whatever killed the
process): the next process to start adopts its segments (their records join its own queue and
spool) and deletes them. Rows carry their event id and the ledger skips ids already stored, so a
record written before its owner died, or adopted twice, is stored once.

Appends go to the operating system at once (one ``write``), which survives the death of the
process but not of the machine: a segment reaches the disk (``fsync``) only when a flush could
not write it, so a power loss can still lose the rows of the last flush interval.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

from llmgw.accounting.usage import UsageRecord

__all__ = ["Spool", "from_line", "spool_directory", "to_line"]

log = logging.getLogger(__name__)

_UUIDS = ("api_key_id", "subject_id", "event_id")


def spool_directory(data_dir: Path, database_url: str | None) -> Path:
    """Where the processes writing to one database spool: the embedded one (None) is the data
    dir's own; another is named by its address, so no process adopts another database's rows."""
    if database_url is None:
        return data_dir / "ledger-spool" / "embedded"
    url = urlsplit(database_url)
    # The address and the user, never a password (the query may name the host, e.g. a socket).
    query = [(k, v) for k, v in parse_qsl(url.query) if "password" not in k.lower()]
    where = f"{url.username}@{url.hostname}:{url.port}{url.path}?{sorted(query)}"
    return data_dir / "ledger-spool" / hashlib.sha256(where.encode()).hexdigest()[:16]


def to_line(record: UsageRecord, fields: dict[str, Any] | None = None) -> bytes:
    """The record's line; ``fields``: its ``log_fields()``, when the caller made them already."""
    return orjson.dumps(
        record.log_fields() if fields is None else fields, option=orjson.OPT_APPEND_NEWLINE
    )


def from_line(line: bytes) -> UsageRecord:
    fields: dict[str, Any] = orjson.loads(line)
    fields["occurred_at"] = datetime.fromisoformat(fields["occurred_at"])
    for name in _UUIDS:
        if fields[name] is not None:
            fields[name] = uuid.UUID(fields[name])
    fields["flags"] = tuple(fields["flags"])
    fields["attempt_log"] = tuple(fields.get("attempt_log", ()))
    # A line spooled before migration 0022 has Venice's diem cost in a field of its own.
    diem = fields.pop("cost_diem", None)
    if diem is not None:
        fields["provider_extras"] = {"venice.cost.diem": diem}
    return UsageRecord(**fields)


class Spool:
    def __init__(self, directory: Path, lock: int, token: str) -> None:
        self._directory = directory
        self._lock = lock
        self._token = token
        self._segment = 0
        self._file: int | None = None  # the segment being appended to; opened by the first append
        self._synced = -1  # segments up to this one are on disk
        self._failing = False

    @classmethod
    def open(cls, directory: Path) -> Spool | None:
        """This process's spool in ``directory``; None (and a warning) if it cannot be made there."""
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock = os.open(directory / f"{token}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            log.warning(
                "usage ledger: no spool in %s (%s: %s); rows not yet written are lost if this "
                "process is killed",
                directory, type(exc).__name__, exc.strerror,
            )  # fmt: skip
            return None
        return cls(directory, lock, token)

    def _path(self, segment: int) -> Path:
        return self._directory / f"{self._token}.{segment}.jsonl"

    def append(self, record: UsageRecord, fields: dict[str, Any] | None = None) -> None:
        """One write; never raises (a full disk costs the spool, not the request). ``fields``: as
        :func:`to_line`'s."""
        try:
            if self._file is None:
                self._file = os.open(
                    self._path(self._segment), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600
                )
            os.write(self._file, to_line(record, fields))
        except OSError as exc:
            if not self._failing:
                log.warning(
                    "usage ledger: the spool cannot be written (%s); rows are kept in memory only "
                    "until the database has them",
                    exc.strerror,
                )
            self._failing = True
            return
        self._failing = False

    def rotate(self) -> int:
        """Start a new segment; returns the number of the last one closed."""
        if self._file is not None:
            os.close(self._file)
            self._file = None
        self._segment += 1
        return self._segment - 1

    def sync(self, through: int) -> None:
        """Put the closed segments up to ``through`` on disk (their rows are not in the database)."""
        for path in self._segments(self._token):
            if self._synced < _number(path) <= through:
                with contextlib.suppress(OSError):
                    descriptor = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(descriptor)
                    finally:
                        os.close(descriptor)
        self._synced = max(self._synced, through)

    def discard(self, through: int) -> None:
        """Delete the segments up to ``through``: their rows are in the database."""
        for path in self._segments(self._token):
            if _number(path) <= through:
                path.unlink(missing_ok=True)

    def adopt(self, take: Callable[[UsageRecord], None]) -> int:
        """Hand every record of processes that are gone to ``take``, then delete their files."""
        adopted = 0
        try:
            locks = sorted(self._directory.glob("*.lock"))
        except OSError:
            return 0
        for lock_path in locks:
            token = lock_path.name.removesuffix(".lock")
            if token == self._token:
                continue
            try:
                lock = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                continue  # another process adopted it just now
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock)
                continue  # its process is alive
            try:
                segments = self._segments(token)
                for path in segments:
                    adopted += _read(path, take)
                for path in segments:
                    path.unlink(missing_ok=True)
                lock_path.unlink(missing_ok=True)
            except OSError as exc:
                # Never a reason not to start: what was not read stays for the next start.
                log.warning(
                    "usage ledger: the spool of %s could not be read (%s: %s)",
                    token, type(exc).__name__, exc.strerror,
                )  # fmt: skip
            finally:
                os.close(lock)
        return adopted

    def close(self, *, empty: bool) -> None:
        """Stop; ``empty``: every row is in the database, so nothing of this process is kept."""
        self.rotate()
        if empty:
            self.discard(self._segment)
            (self._directory / f"{self._token}.lock").unlink(missing_ok=True)
        os.close(self._lock)

    def _segments(self, token: str) -> list[Path]:
        return sorted(self._directory.glob(f"{token}.*.jsonl"), key=_number)


def _number(path: Path) -> int:
    return int(path.name.split(".")[-2])


def _read(path: Path, take: Callable[[UsageRecord], None]) -> int:
    count = 0
    with path.open("rb") as lines:
        for line in lines:
            try:
                record = from_line(line)
            except (ValueError, TypeError, KeyError) as exc:
                # A line cut short by a full disk: the rest of the segment is still read.
                log.warning("usage ledger: an unreadable spool line in %s skipped (%s)", path, exc)
                continue
            take(record)
            count += 1
    return count
