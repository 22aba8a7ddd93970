"""``llmgw keys``: create, list, revoke and rotate gateway keys."""

from __future__ import annotations

import argparse
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import attrs
import orjson

from llmgw.cli.common import (
    CommandError,
    environment_help,
    grace_seconds,
    positive_int,
    prepare_database,
    run_with_connection,
)
from llmgw.config import load_settings
from llmgw.storage import api_keys, bounds
from llmgw.storage.api_keys import ApiKeyRecord, DuplicateKeyPrefix, IssuedKey, KeyNotFound

__all__ = ["register"]

_DB_ENV = ("DATABASE_URL", "LLMGW_DATA_DIR")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = commands.add_parser(
        "keys",
        help="create, list, revoke and rotate gateway keys",
        description=(
            "Manage the keys callers use to reach llmgw. Only a 12-character prefix and a SHA-256 "
            "hash are stored; the plaintext is printed once, when the key is made."
        ),
        epilog=environment_help(_DB_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = keys.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser(
        "create",
        help="issue a new key and print it once",
        description="Issue a key. Without --key, a random 'llmg_...' key with 256 bits of entropy.",
        epilog=environment_help(_DB_ENV),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    create.add_argument(
        "--name",
        required=True,
        type=_name,
        help="who or what the key is for, e.g. 'billing-service'",
    )
    create.add_argument(
        "--subject-id", type=uuid.UUID, help="UUID of the team/user the key belongs to"
    )
    create.add_argument(
        "--rate-limit-requests",
        type=positive_int,
        default=api_keys.DEFAULT_RATE_LIMIT_REQUESTS,
        help=f"requests per window (default {api_keys.DEFAULT_RATE_LIMIT_REQUESTS})",
    )
    create.add_argument(
        "--rate-limit-window-seconds",
        type=positive_int,
        default=api_keys.DEFAULT_RATE_LIMIT_WINDOW_SECONDS,
        help=f"window length in seconds (default {api_keys.DEFAULT_RATE_LIMIT_WINDOW_SECONDS})",
    )
    create.add_argument(
        "--allowed-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model the key may call (repeat for several; none = every model)",
    )
    create.add_argument(
        "--expires-at",
        type=_future_timestamp,
        metavar="RFC3339",
        help="when the key stops working (in the future), e.g. 2027-01-31T00:00:00Z",
    )
    create.add_argument(
        "--tokens-per-minute", type=positive_int, help="tokens the key may use per minute"
    )
    create.add_argument(
        "--max-concurrent-requests",
        type=positive_int,
        help="requests of the key in flight at once, across replicas (default: unlimited)",
    )
    create.add_argument(
        "--key",
        metavar="PLAINTEXT",
        help="use this exact key (e.g. a known local dev key like llmg_dev_0123456789abcdef)",
    )
    create.add_argument("--json", action="store_true", help="print JSON instead of text")
    create.set_defaults(run=_create)

    listing = actions.add_parser("list", help="list keys (never shows a secret)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(run=_list)

    revoke = actions.add_parser("revoke", help="deactivate a key at once, on every replica")
    revoke.add_argument("key", metavar="KEY", help=_REFERENCE_HELP)
    revoke.add_argument("--json", action="store_true", help="print JSON instead of text")
    revoke.set_defaults(run=_revoke)

    rotate = actions.add_parser(
        "rotate", help="issue a replacement with the same settings and revoke the old key"
    )
    rotate.add_argument("key", metavar="KEY", help=_REFERENCE_HELP)
    rotate.add_argument(
        "--grace-seconds",
        type=grace_seconds,
        default=0,
        help="keep the old key working this long (default 0: it stops at once)",
    )
    rotate.add_argument("--json", action="store_true", help="print JSON instead of text")
    rotate.set_defaults(run=_rotate)


_REFERENCE_HELP = "the key's id, its 12-character prefix, or the whole key"


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _future_timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an RFC 3339 time, got {text!r}") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give a time zone, e.g. {text}Z")
    problem = bounds.time_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"the time {problem}")
    if value <= datetime.now(UTC):
        raise argparse.ArgumentTypeError(f"{text} is not in the future")
    return value


def _database_url() -> str:
    return prepare_database(load_settings())


def _record_json(record: ApiKeyRecord) -> dict[str, Any]:
    return {
        name: (str(value) if isinstance(value, uuid.UUID) else value)
        for name, value in attrs.asdict(record).items()
    }


def _print_issued(issued: IssuedKey, as_json: bool, verb: str) -> None:
    if as_json:
        print(
            orjson.dumps(
                {**_record_json(issued.record), "key": issued.plaintext}, default=str
            ).decode()
        )
        return
    print(issued.plaintext)
    record = issued.record
    print(
        f"{verb} key {record.prefix} (id {record.id}, name {record.name!r}). "
        "Store it now: it is not shown again.\n"
        f"limits: {_describe_limits(record)}\n"
        f"change them with PATCH /admin/v1/keys/{record.id} or in the console",
        file=sys.stderr,
    )


def _describe_limits(record: ApiKeyRecord) -> str:
    """A key's limits in one line, unset ones included (so a default is never a surprise)."""
    models = ", ".join(record.allowed_models) or "any"
    return "; ".join(
        [
            f"{record.rate_limit_requests} requests per {record.rate_limit_window_seconds} s",
            f"tokens per minute {record.tokens_per_minute or 'unlimited'}",
            f"concurrent requests {record.max_concurrent_requests or 'unlimited'}",
            f"models {models}",
            f"expires {record.expires_at.isoformat() if record.expires_at else 'never'}",
        ]
    )


def _create(args: argparse.Namespace) -> int:
    settings = api_keys.KeySettings(
        name=args.name,
        subject_id=args.subject_id,
        rate_limit_requests=args.rate_limit_requests,
        rate_limit_window_seconds=args.rate_limit_window_seconds,
        allowed_models=tuple(args.allowed_model),
        expires_at=args.expires_at,
        tokens_per_minute=args.tokens_per_minute,
        max_concurrent_requests=args.max_concurrent_requests,
    )
    try:
        issued = run_with_connection(
            _database_url(), lambda conn: api_keys.create_key(conn, settings, plaintext=args.key)
        )
    except (DuplicateKeyPrefix, ValueError) as exc:
        raise CommandError(str(exc)) from None
    _print_issued(issued, args.json, "created")
    return 0


def _list(args: argparse.Namespace) -> int:
    records = run_with_connection(_database_url(), api_keys.list_keys)
    if args.json:
        print(orjson.dumps([_record_json(r) for r in records], default=str).decode())
        return 0
    header = (
        "ID",
        "PREFIX",
        "NAME",
        "SUBJECT",
        "LIMIT",
        "ACTIVE",
        "EXPIRES",
        "CREATED",
        "LAST USED",
    )
    rows = [
        (
            str(r.id),
            r.prefix,
            r.name,
            str(r.subject_id or "-"),
            f"{r.rate_limit_requests}/{r.rate_limit_window_seconds}s",
            "yes" if r.is_active else "no",
            r.expires_at.isoformat(timespec="seconds") if r.expires_at else "never",
            r.created_at.isoformat(timespec="seconds"),
            r.last_used_at.isoformat(timespec="seconds") if r.last_used_at else "never",
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    try:
        record = run_with_connection(
            _database_url(), lambda conn: api_keys.revoke_key(conn, args.key)
        )
    except KeyNotFound as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print(orjson.dumps(_record_json(record), default=str).decode())
    else:
        print(f"revoked key {record.prefix} (id {record.id})")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    try:
        _, issued = run_with_connection(
            _database_url(),
            lambda conn: api_keys.rotate_key(conn, args.key, grace_seconds=args.grace_seconds),
        )
    except KeyNotFound as exc:
        raise CommandError(str(exc)) from None
    _print_issued(issued, args.json, "rotated: new")
    return 0
