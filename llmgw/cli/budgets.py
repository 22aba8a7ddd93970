"""``llmgw budgets``: set, clear and show a subject's monthly budget (as the console's Subjects page)."""

from __future__ import annotations

import argparse
import uuid

import asyncpg
import orjson

from llmgw.admin.schemas import SubjectBudgetUpdate, parse, to_json
from llmgw.cli.common import (
    EXIT_CONFIG,
    CommandError,
    environment_help,
    prepare_database,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.errors import InvalidRequest
from llmgw.storage import subjects
from llmgw.storage.audit import write_audit

__all__ = ["register"]

_DB_ENV = ("DATABASE_URL", "LLMGW_DATA_DIR")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    budgets = commands.add_parser(
        "budgets",
        help="set, clear and show subjects' monthly budgets",
        description=(
            "A subject (team or user) has an optional monthly budget in USD shared by all its keys; "
            "requests that would exceed it are refused until the first of the next month (UTC)."
        ),
        epilog=environment_help(_DB_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = budgets.add_subparsers(dest="action", metavar="ACTION", required=True)
    set_cap = actions.add_parser("set", help="set a subject's monthly budget in USD")
    set_cap.add_argument("subject", type=uuid.UUID, help="the subject's UUID")
    set_cap.add_argument("usd", help="the monthly cap in USD, e.g. 250 or 0.5; 'none' clears it")
    set_cap.set_defaults(run=_set)
    show = actions.add_parser("show", help="a subject's budget and month-to-date spend")
    show.add_argument("subject", type=uuid.UUID, help="the subject's UUID")
    show.set_defaults(run=_show)


def _set(args: argparse.Namespace) -> int:
    cap: float | None
    if args.usd.lower() == "none":
        cap = None
    else:
        try:
            cap = float(args.usd)
        except ValueError:
            raise CommandError(
                f"USD must be a number or 'none', not {args.usd!r}", EXIT_CONFIG
            ) from None
    try:
        wanted = parse({"monthly_budget_usd": cap}, SubjectBudgetUpdate)
    except InvalidRequest as exc:
        raise CommandError(exc.message, exit_code=EXIT_CONFIG) from None

    async def work(conn: asyncpg.Connection) -> subjects.SubjectBudget:
        async with conn.transaction():
            before, after = await subjects.set_budget(conn, args.subject, wanted.monthly_budget_usd)
            await write_audit(
                conn,
                actor="cli",
                action="subject.budget",
                target=str(args.subject),
                before=to_json(before),
                after=to_json(after),
            )
        return after

    after = run_with_connection(prepare_database(load_settings()), work)
    _print(after)
    return 0


def _show(args: argparse.Namespace) -> int:
    found = run_with_connection(
        prepare_database(load_settings()), lambda conn: subjects.get_subject(conn, args.subject)
    )
    _print(found)
    return 0


def _print(subject: subjects.SubjectBudget) -> None:
    print(orjson.dumps(to_json(subject), option=orjson.OPT_INDENT_2).decode())
