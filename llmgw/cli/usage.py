"""``llmgw usage``: reports (``report``), retention (``prune``) and dead letters of the ledger."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date, timedelta
from typing import Any

import orjson

from llmgw.admin.api import REPORT_COLUMNS, report_cell, report_csv, report_query
from llmgw.cli.common import (
    EXIT_CONFIG,
    CommandError,
    bounded_int,
    environment_help,
    positive_int,
    prepare_database,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.errors import InvalidRequest
from llmgw.storage import bounds
from llmgw.storage.rollup import REPORT_GROUPINGS, usage_report
from llmgw.storage.usage import prune_usage, read_dead_letters

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    usage = commands.add_parser(
        "usage",
        help="report on the usage ledger, prune it, read its dead letters",
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

    report = actions.add_parser(
        "report",
        help="requests, errors, tokens and spend by day, model, key or subject",
        description=(
            "The figures the console's Usage page shows, from the hourly rollup, over whole UTC "
            "days [--from, --to). Default: the last 30 days up to and including today."
        ),
        epilog=environment_help(("DATABASE_URL", "LLMGW_DATA_DIR")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("--by", choices=sorted(set(REPORT_GROUPINGS) - {"hour"}), default="day")
    report.add_argument("--from", dest="start", type=date.fromisoformat, metavar="YYYY-MM-DD")
    report.add_argument("--to", dest="end", type=date.fromisoformat, metavar="YYYY-MM-DD")
    report.add_argument("--key-id", help="only this key (UUID)")
    report.add_argument("--subject-id", help="only this subject (UUID)")
    output = report.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the rows as JSON")
    output.add_argument("--csv", action="store_true", help="print the rows as CSV")
    report.set_defaults(run=_report)


def _prune(args: argparse.Namespace) -> int:
    url = prepare_database(load_settings())
    deleted = run_with_connection(
        url, lambda conn: prune_usage(conn, timedelta(days=args.older_than_days))
    )
    print(f"deleted {deleted} usage rows older than {args.older_than_days} days")
    return 0


def _report(args: argparse.Namespace) -> int:
    given: dict[str, Any] = {"by": args.by}
    for name, value in (
        ("from", args.start),
        ("to", args.end),
        ("key_id", args.key_id),
        ("subject_id", args.subject_id),
    ):
        if value is not None:
            given[name] = str(value)
    try:
        query = report_query(given)
    except InvalidRequest as exc:
        raise CommandError(exc.message, exit_code=EXIT_CONFIG) from None
    url = prepare_database(load_settings())
    rows = run_with_connection(url, lambda conn: usage_report(conn, query))
    if args.json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.csv:
        sys.stdout.write(report_csv(query.by, rows))
    else:
        _print_table(query.by, rows)
    return 0


def _print_table(by: str, rows: list[dict[str, Any]]) -> None:
    header = (by, *REPORT_COLUMNS)
    lines = [header] + [tuple(str(report_cell(row[column])) for column in header) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def _dead_letters(args: argparse.Namespace) -> int:
    url = prepare_database(load_settings())
    for letter in run_with_connection(url, lambda conn: read_dead_letters(conn, args.limit)):
        print(json.dumps(letter))  # ASCII: nothing in it can drive a terminal
    return 0
