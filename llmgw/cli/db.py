"""``llmgw db``: migrate the schema (the same migrations ``alembic upgrade head`` runs)."""

from __future__ import annotations

import argparse

from llmgw.cli.common import (
    EXIT_CONFIG,
    CommandError,
    database_url,
    environment_help,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.storage import revisions
from llmgw.storage.database import DATABASE_DOWN_ERRORS

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
    upgrade.set_defaults(run=_upgrade)
    downgrade = actions.add_parser("downgrade", help="migrate down to a revision ('base' = empty)")
    downgrade.add_argument("revision")
    downgrade.set_defaults(run=_downgrade)
    current = actions.add_parser("current", help="print the revision the database is at")
    current.set_defaults(run=_current)


def _url() -> str:
    return database_url(load_settings())


def _migrate(action: str, revision: str) -> int:
    # Imported here: Alembic and SQLAlchemy are for this command, not for every llmgw process.
    from alembic.util import CommandError as AlembicCommandError

    from llmgw.storage import migrations

    url = _url()
    # Connect once without Alembic first, so an unreachable or refusing database is reported as
    # every other command reports it, not as SQLAlchemy's wrapped exception.
    run_with_connection(url, revisions.current_revision)
    try:
        if action == "upgrade":
            migrations.upgrade(url, revision)
        else:
            migrations.downgrade(url, revision)
    except DATABASE_DOWN_ERRORS as exc:
        raise CommandError(f"cannot reach the database ({type(exc).__name__})") from None
    except AlembicCommandError as exc:  # an unknown or ambiguous revision
        raise CommandError(f"db {action} {revision}: {exc}", EXIT_CONFIG) from None
    print(f"database {action}d to {revision}")
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    return _migrate("upgrade", args.revision)


def _downgrade(args: argparse.Namespace) -> int:
    return _migrate("downgrade", args.revision)


def _current(_args: argparse.Namespace) -> int:
    revision = run_with_connection(_url(), revisions.current_revision)
    head = revisions.head_revision()
    print(f"{revision or 'none'} (head is {head})")
    return 0
