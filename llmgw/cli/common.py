"""What every subcommand shares: exit codes, errors for the operator, the database it talks to."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from llmgw.config import ENVIRONMENT_VARIABLES, Settings
from llmgw.storage import bounds, revisions
from llmgw.storage.database import DATABASE_DOWN_ERRORS
from llmgw.storage.embedded import EmbeddedDatabaseError, resolve_database_url

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "CommandError",
    "bounded_int",
    "database_url",
    "environment_help",
    "grace_seconds",
    "positive_int",
    "prepare_database",
    "run_with_connection",
]

EXIT_FAILURE = 1
EXIT_CONFIG = 2

T = TypeVar("T")


class CommandError(Exception):
    """A failure the operator can act on: printed as one line, no traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def bounded_int(high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be 1-{high}, not {text}")
        return value

    return parse


# The INTEGER columns' range: limits, windows and tokens per minute.
positive_int = bounded_int(bounds.INT4_MAX)


def grace_seconds(text: str) -> float:
    """An argparse type: seconds from 0 to ``bounds.MAX_GRACE_SECONDS``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not 0 <= value <= bounds.MAX_GRACE_SECONDS:
        raise argparse.ArgumentTypeError(f"must be 0-{bounds.MAX_GRACE_SECONDS}, not {text}")
    return value


def environment_help(names: tuple[str, ...] | None = None) -> str:
    rows = [var for var in ENVIRONMENT_VARIABLES if names is None or var.name in names]
    width = max(len(var.name) for var in rows)
    lines = ["environment variables:"]
    for var in rows:
        default = f" (default: {var.default})" if var.default is not None else ""
        lines.append(f"  {var.name.ljust(width)}  {var.help}{default}")
    return "\n".join(lines)


def database_url(settings: Settings) -> str:
    """The database URL to use: DATABASE_URL, or the embedded cluster's (started when needed).

    An embedded cluster that cannot start (a read-only LLMGW_DATA_DIR, ...) is a start-up error
    only the operator can fix: exit status 2.
    """
    try:
        return resolve_database_url(settings)
    except EmbeddedDatabaseError as exc:
        raise CommandError(str(exc), EXIT_CONFIG) from None


def prepare_database(settings: Settings) -> str:
    """The database URL to use, with the schema at head (migrating when allowed)."""
    url = database_url(settings)
    head = revisions.head_revision()
    revision = run_with_connection(url, revisions.current_revision)
    if revision == head:
        return url
    if settings.uses_embedded_database or settings.auto_migrate:
        _migrate(url)
        return url
    raise CommandError(
        f"the database schema is at {revision or 'nothing (empty database)'}, not {head}: "
        "run 'alembic upgrade head' (or 'llmgw db upgrade') as a release step, "
        "or set LLMGW_AUTO_MIGRATE=true"
    )


def _migrate(url: str) -> None:
    # In a child process, so the serving process never loads Alembic and SQLAlchemy (~44 MiB).
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "db", "upgrade"],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        # The child's last line is its reason (`llmgw: ...`); should an unforeseen error escape
        # as a traceback, SQLAlchemy's closing link to its error catalogue is not the cause.
        lines = [
            line.removeprefix("llmgw: ")
            for line in (result.stderr or result.stdout).strip().splitlines()
            if not line.startswith("(Background on this error at:")
        ]
        raise CommandError(f"migrating the database failed: {lines[-1] if lines else 'no output'}")


def _unreachable(exc: BaseException) -> str:
    return (
        f"cannot reach the database ({type(exc).__name__}); check DATABASE_URL and that "
        "PostgreSQL is running"
    )


# The server answered and refused: unknown database or role, wrong password, no access. Only
# the operator can fix that, so it is a configuration error (exit 2). The server's message names
# the database or role, never the password.
_REFUSED_ERRORS = (asyncpg.InvalidCatalogNameError, asyncpg.InvalidAuthorizationSpecificationError)


def run_with_connection(url: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    async def run() -> T:
        try:
            connection = await asyncpg.connect(url, timeout=10)
        except DATABASE_DOWN_ERRORS as exc:
            raise CommandError(_unreachable(exc)) from None
        except _REFUSED_ERRORS as exc:
            raise CommandError(
                f"the database refused the connection: {exc}; check DATABASE_URL", EXIT_CONFIG
            ) from None
        try:
            return await work(connection)
        finally:
            await connection.close()

    return asyncio.run(run())
