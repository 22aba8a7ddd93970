"""``llmgw teams``: list, create, show, update and delete teams, as ``/admin/v1/teams`` does."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import attrs
import orjson

from llmgw.admin.schemas import TeamCreate, parse, to_json
from llmgw.cli.common import (
    EXIT_CONFIG,
    CommandError,
    environment_help,
    prepare_database,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.errors import InvalidRequest
from llmgw.storage import teams
from llmgw.storage.audit import write_audit

__all__ = ["register"]

_DB_ENV = ("DATABASE_URL", "LLMGW_DATA_DIR")
T = TypeVar("T")

# Options that set a team field, and how their text becomes the field's JSON value.
_SETTINGS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--budget-usd", "monthly_budget_usd", float, "monthly budget in USD over all its keys"),
    ("--rate-limit-requests", "rate_limit_requests", int, "requests per window over all its keys"),
    ("--rate-limit-window-seconds", "rate_limit_window_seconds", int, "the window, in seconds"),
    ("--tokens-per-minute", "tokens_per_minute", int, "tokens per minute over all its keys"),
    ("--max-concurrent-requests", "max_concurrent_requests", int, "requests in flight at once"),
    ("--oidc-group", "oidc_group", str, "identity-provider group whose members are members"),
    ("--oidc-admin-group", "oidc_admin_group", str, "group whose members are team admins"),
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "teams",
        help="list, create, show, update and delete teams",
        description=(
            "A team's limits (budget, request window, tokens per minute, concurrency, models) apply "
            "over all its keys, on top of each key's own. Mirrors /admin/v1/teams."
        ),
        epilog=environment_help(_DB_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every team, as JSON lines")
    listing.set_defaults(run=_list)
    create = actions.add_parser("create", help="create a team")
    create.add_argument("--name", required=True, help="the team's name (unique)")
    _add_settings(create)
    create.set_defaults(run=_create)
    show = actions.add_parser("show", help="one team, with its month-to-date spend")
    show.add_argument("team", type=uuid.UUID, help="the team's id")
    show.set_defaults(run=_show)
    update = actions.add_parser("update", help="change a team's settings")
    update.add_argument("team", type=uuid.UUID, help="the team's id")
    update.add_argument("--name", help="a new name")
    _add_settings(update)
    update.add_argument(
        "--clear",
        action="append",
        default=[],
        choices=[field for _, field, _, _ in _SETTINGS] + ["allowed_models"],
        help="remove a setting (repeatable)",
    )
    update.set_defaults(run=_update)
    delete = actions.add_parser("delete", help="delete a team without active keys")
    delete.add_argument("team", type=uuid.UUID, help="the team's id")
    delete.set_defaults(run=_delete)


def _add_settings(parser: argparse.ArgumentParser) -> None:
    for option, field, kind, text in _SETTINGS:
        parser.add_argument(option, dest=field, type=kind, help=text)
    parser.add_argument(
        "--allowed-model",
        dest="allowed_models",
        action="append",
        help="a model its keys may use (repeatable; none: every model)",
    )


def _given(args: argparse.Namespace) -> dict[str, Any]:
    fields = ["name", "allowed_models", *(field for _, field, _, _ in _SETTINGS)]
    given = {field: getattr(args, field) for field in fields if getattr(args, field) is not None}
    cleared = getattr(args, "clear", [])  # update only
    given.update({field: [] if field == "allowed_models" else None for field in cleared})
    return given


def _checked(body: dict[str, Any]) -> TeamCreate:
    try:
        return parse(body, TeamCreate)
    except InvalidRequest as exc:
        raise CommandError(exc.message, exit_code=EXIT_CONFIG) from None


def _run(work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    try:
        return run_with_connection(prepare_database(load_settings()), work)
    except (teams.TeamNotFound, teams.TeamNameTaken, teams.TeamHasKeys) as exc:
        raise CommandError(str(exc)) from None


async def _audited(
    conn: asyncpg.Connection, action: str, target: uuid.UUID, before: Any, after: Any
) -> None:
    await write_audit(
        conn,
        actor="cli",
        action=action,
        target=str(target),
        before=None if before is None else to_json(before),
        after=None if after is None else to_json(after),
    )


def _list(_args: argparse.Namespace) -> int:
    for team in _run(lambda conn: teams.list_teams(conn)):
        print(orjson.dumps(to_json(team)).decode())
    return 0


def _create(args: argparse.Namespace) -> int:
    wanted = _checked(_given(args))

    async def work(conn: asyncpg.Connection) -> teams.TeamRecord:
        async with conn.transaction():
            team = await teams.create_team(
                conn, teams.TeamSettings(**attrs.asdict(wanted, recurse=False))
            )
            await _audited(conn, "team.create", team.id, None, team)
        return team

    _print(_run(work))
    return 0


def _show(args: argparse.Namespace) -> int:
    _print(_run(lambda conn: teams.find_team(conn, args.team)))
    return 0


def _update(args: argparse.Namespace) -> int:
    changes = _given(args)

    async def work(conn: asyncpg.Connection) -> teams.TeamRecord:
        async with conn.transaction():
            current = await teams.find_team(conn, args.team)
            merged = {name: to_json(getattr(current, name)) for name in teams.TEAM_FIELDS}
            wanted = _checked({**merged, **changes})
            before, after = await teams.update_team(
                conn, args.team, {name: getattr(wanted, name) for name in changes}
            )
            await _audited(conn, "team.update", args.team, before, after)
        return after

    _print(_run(work))
    return 0


def _delete(args: argparse.Namespace) -> int:
    async def work(conn: asyncpg.Connection) -> teams.TeamRecord:
        async with conn.transaction():
            before = await teams.delete_team(conn, args.team)
            await _audited(conn, "team.delete", args.team, before, None)
        return before

    _print(_run(work))
    return 0


def _print(team: teams.TeamRecord) -> None:
    print(orjson.dumps(to_json(team), option=orjson.OPT_INDENT_2).decode())
