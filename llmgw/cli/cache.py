"""``llmgw cache clear``: delete response-cache entries. A Redis cache (``LLMGW_CACHE=redis``) is
cleared in Redis and audited in the database; a memory cache lives in the serving process, so it is
cleared through a running gateway's admin API (``DELETE /admin/v1/cache``, which audits it), as is
any cache when ``--url`` is given."""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from typing import Any

import aiohttp
import orjson

from llmgw.cache.store import CacheUnavailable
from llmgw.cli.common import EXIT_CONFIG, CommandError, prepare_database, run_with_connection
from llmgw.cli.smoke import default_base_url
from llmgw.config import Settings, load_bind_addr, load_settings
from llmgw.storage.audit import write_audit

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cache = commands.add_parser(
        "cache",
        help="manage the response cache (clear)",
        description="The response cache (LLMGW_CACHE): clear all of it, or one key's or model's.",
        epilog=(
            "environment variables:\n"
            "  LLMGW_CACHE        redis: cleared in REDIS_URL directly (audited in DATABASE_URL)\n"
            "  LLMGW_ADMIN_TOKEN  the admin API's bearer token (a memory cache, or --url)\n"
            "  BIND_ADDR          where the gateway listens, for the default --url"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = cache.add_subparsers(dest="action", metavar="ACTION", required=True)
    clear = actions.add_parser("clear", help="delete cached answers (all, or --key-id / --model)")
    clear.add_argument("--key-id", type=_key_id, help="only the entries this key stored (its id)")
    clear.add_argument("--model", help="only the entries of this model (as callers name it)")
    clear.add_argument(
        "--url", help="gateway root (default: http://HOST:PORT from BIND_ADDR, 127.0.0.1:3000)"
    )
    clear.set_defaults(run=_clear)


async def _delete(url: str, token: str, params: dict[str, str]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.delete(
            url, params=params, headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        return response.status, await response.read()


def _key_id(text: str) -> str:
    """A key's id as entries are filed under it: a UUID in its canonical form, as the admin
    API reads ``?key_id=`` (the same id in capitals must not clear nothing)."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a key id (a UUID): {text!r}") from None


def _clear(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.url is None and settings.cache == "redis":
        deleted = _clear_redis(settings, args.key_id, args.model)
    else:
        deleted = _clear_through_gateway(args)
    print(f"deleted {deleted} cached answers")
    return 0


def _clear_redis(settings: Settings, key_id: str | None, model: str | None) -> int:
    from llmgw.cache.redis import RedisCacheStore  # the optional extra

    assert settings.redis_url is not None  # load_settings requires it with LLMGW_CACHE=redis
    url = prepare_database(settings)

    async def clear() -> int:
        store = RedisCacheStore(settings.redis_url or "", budget_seconds=5.0)
        try:
            return await store.clear(key_id=key_id, model=model)
        finally:
            await store.close()

    try:
        deleted = asyncio.run(clear())
    except CacheUnavailable as exc:
        raise CommandError(f"Redis did not answer: {exc}") from None

    async def audit(conn: Any) -> None:
        await write_audit(
            conn,
            actor="cli",
            action="cache.clear",
            target=key_id or model or "*",
            after={"key_id": key_id, "model": model, "deleted": deleted},
        )

    run_with_connection(url, audit)
    return deleted


def _clear_through_gateway(args: argparse.Namespace) -> int:
    token = os.environ.get("LLMGW_ADMIN_TOKEN", "").strip()
    if not token:
        raise CommandError("set LLMGW_ADMIN_TOKEN to the gateway's admin token", EXIT_CONFIG)
    root = args.url or default_base_url(load_bind_addr()).removesuffix("/v1")
    url = root.rstrip("/") + "/admin/v1/cache"
    params = {
        name: value
        for name, value in (("key_id", args.key_id), ("model", args.model))
        if value is not None
    }
    try:
        status, body = asyncio.run(_delete(url, token, params))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CommandError(f"cannot reach {url}: {type(exc).__name__}") from None
    if status != 200:
        raise CommandError(f"{url} answered {status}: {body.decode(errors='replace')[:200]}")
    deleted: int = orjson.loads(body)["deleted"]
    return deleted
