"""``llmgw db``: migrate the schema (the same migrations ``alembic upgrade head`` runs)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from llmgw.cli.common import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    CommandError,
    database_url,
    environment_help,
    grace_seconds,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.storage import revisions
from llmgw.storage.database import DATABASE_DOWN_ERRORS

if TYPE_CHECKING:
    from llmgw.storage.migrations import Upgraded

__all__ = ["register"]

_DB_ENV = ("DATABASE_URL", "LLMGW_DATA_DIR")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = commands.add_parser(
        "db",
        help="migrate or inspect the database schema",
        description=(
            "Run llmgw's Alembic migrations from any directory (what 'alembic upgrade head' does "
            "from a checkout). With DATABASE_URL unset, acts on the embedded database."
        ),
        epilog=environment_help(_DB_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = db.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = actions.add_parser("upgrade", help="migrate to a revision (default: head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.add_argument(
        "--wait-for-database",
        type=grace_seconds,
        default=0.0,
        metavar="SECONDS",
        help="retry an unreachable database for up to SECONDS (a release step started beside it)",
    )
    upgrade.set_defaults(run=_upgrade)
    downgrade = actions.add_parser("downgrade", help="migrate down to a revision ('base' = empty)")
    downgrade.add_argument("revision")
    downgrade.set_defaults(run=_downgrade)
    current = actions.add_parser("current", help="print the revision the database is at")
    current.set_defaults(run=_current)


def _url() -> str:
    return database_url(load_settings())


def _wait_for_database(url: str, seconds: float) -> None:
    """Connect until the database answers, for up to ``seconds``; refusals are not retried."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            run_with_connection(url, revisions.current_revision)
            return
        except CommandError as exc:
            if exc.exit_code != EXIT_FAILURE or time.monotonic() >= deadline:
                if seconds and exc.exit_code == EXIT_FAILURE:
                    raise CommandError(f"{exc} (waited {seconds:g} s)") from None
                raise
        time.sleep(1.0)


def _cause(exc: BaseException) -> str:
    """The database's own reason for a failed statement: SQLAlchemy wraps the driver's exception
    (twice, for asyncpg) and ends its message with a link to its error catalogue."""
    inner: BaseException = exc
    while True:
        wrapped = getattr(inner, "orig", None) or inner.__cause__
        if not isinstance(wrapped, BaseException):
            break
        inner = wrapped
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else 'no message'}"


def _waiting() -> None:
    print("llmgw: another migration holds the migration lock; waiting for it", file=sys.stderr)


def _outcome(revision: str, upgraded: Upgraded) -> str:
    before = upgraded.before or "nothing (empty)"
    waited = " (after waiting for another migration)" if upgraded.waited else ""
    if upgraded.before == upgraded.after:
        return f"database already at {upgraded.after or 'nothing'}{waited}; nothing to do"
    return f"database upgraded to {revision} ({upgraded.after}) from {before}{waited}"


def _migrate(action: str, revision: str, wait_seconds: float = 0.0) -> int:
    # Imported here: Alembic and SQLAlchemy are for this command, not for every llmgw process.
    from alembic.util import CommandError as AlembicCommandError
    from sqlalchemy.exc import DBAPIError

    from llmgw.storage import migrations

    url = _url()
    # Connect without Alembic first, so an unreachable or refusing database is reported as every
    # other command reports it, not as SQLAlchemy's wrapped exception.
    _wait_for_database(url, wait_seconds)
    try:
        if action == "upgrade":
            print(_outcome(revision, migrations.upgrade(url, revision, on_wait=_waiting)))
        else:
            migrations.downgrade(url, revision)
            print(f"database downgraded to {revision}")
    except DATABASE_DOWN_ERRORS as exc:
        raise CommandError(f"cannot reach the database ({type(exc).__name__})") from None
    except AlembicCommandError as exc:  # an unknown or ambiguous revision
        raise CommandError(f"db {action} {revision}: {exc}", EXIT_CONFIG) from None
    except (DBAPIError, migrations.MigrationLockTimeout) as exc:
        raise CommandError(f"db {action} {revision} failed: {_cause(exc)}") from None
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    return _migrate("upgrade", args.revision, args.wait_for_database)


def _downgrade(args: argparse.Namespace) -> int:
    return _migrate("downgrade", args.revision)


def _current(_args: argparse.Namespace) -> int:
    revision = run_with_connection(_url(), revisions.current_revision)
    head = revisions.head_revision()
    print(f"{revision or 'none'} (head is {head})")
    return 0
