"""``llmgw usage``: retention for the usage ledger (``prune``)."""

from __future__ import annotations

import argparse
from datetime import timedelta

from llmgw.cli.common import (
    bounded_int,
    environment_help,
    prepare_database,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.storage import bounds
from llmgw.storage.usage import prune_usage

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    usage = commands.add_parser(
        "usage",
        help="manage the usage ledger (retention)",
        description=(
            "The usage ledger (table usage_events) holds one row per chat or embeddings request. "
            "Rows are never deleted by the gateway itself; prune old ones on a schedule (cron, a "
            "Kubernetes CronJob). Month-to-date spend used by budgets is kept separately and is "
            "not affected."
        ),
        epilog=environment_help(("DATABASE_URL", "LLMGW_DATA_DIR")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = usage.add_subparsers(dest="action", metavar="ACTION", required=True)
    prune = actions.add_parser("prune", help="delete usage rows older than a number of days")
    prune.add_argument(
        "--older-than-days",
        type=bounded_int(bounds.MAX_RETENTION_DAYS),
        required=True,
        help="delete rows recorded more than this many days ago",
    )
    prune.set_defaults(run=_prune)


def _prune(args: argparse.Namespace) -> int:
    url = prepare_database(load_settings())
    deleted = run_with_connection(
        url, lambda conn: prune_usage(conn, timedelta(days=args.older_than_days))
    )
    print(f"deleted {deleted} usage rows older than {args.older_than_days} days")
    return 0
