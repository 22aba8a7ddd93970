"""``llmgw usage``: retention for the usage ledger (``prune``), and its dead letters."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

from llmgw.cli.common import (
    environment_help,
    positive_int,
    prepare_database,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.storage.usage import prune_usage, read_dead_letters

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    usage = commands.add_parser(
        "usage",
        help="manage the usage ledger (retention, dead letters)",
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
        type=positive_int,
        required=True,
        help="delete rows recorded more than this many days ago",
    )
    prune.set_defaults(run=_prune)
    dead = actions.add_parser(
        "dead-letters",
        help="show usage rows the database refused (one JSON object a line)",
        description=(
            "Rows the database refused even alone are kept in usage_dead_letters with the error; "
            "every other row of their batch was written. Each line: id, set_aside_at, request_id, "
            "error_type, error_message and the record as the billing line had it."
        ),
    )
    dead.add_argument(
        "--limit", type=positive_int, default=100, help="the most recent N (default: 100)"
    )
    dead.set_defaults(run=_dead_letters)


def _prune(args: argparse.Namespace) -> int:
    url = prepare_database(load_settings())
    deleted = run_with_connection(
        url, lambda conn: prune_usage(conn, timedelta(days=args.older_than_days))
    )
    print(f"deleted {deleted} usage rows older than {args.older_than_days} days")
    return 0


def _dead_letters(args: argparse.Namespace) -> int:
    url = prepare_database(load_settings())
    for letter in run_with_connection(url, lambda conn: read_dead_letters(conn, args.limit)):
        print(json.dumps(letter))  # ASCII: nothing in it can drive a terminal
    return 0
