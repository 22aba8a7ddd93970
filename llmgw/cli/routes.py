"""``llmgw routes``: each model alias's strategy and each deployment's health, as a running gateway
sees them (its admin API's ``GET /admin/v1/routes``: the state lives in the serving processes)."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import aiohttp
import orjson

from llmgw.cli.common import EXIT_CONFIG, CommandError
from llmgw.cli.smoke import default_base_url
from llmgw.config import load_bind_addr

__all__ = ["register"]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    routes = commands.add_parser(
        "routes",
        help="show each model alias's strategy and each deployment's circuit state",
        description=(
            "Ask a running gateway how it routes: every alias with its strategy and deployments, "
            "and every deployment's circuit (closed, open until when, half-open), its consecutive "
            "failures, requests in flight and average time to first token on the replica that answers."
        ),
        epilog=(
            "environment variables:\n"
            "  LLMGW_ADMIN_TOKEN  the admin API's bearer token (required)\n"
            "  BIND_ADDR          where the gateway listens, for the default --url"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    routes.add_argument(
        "--url", help="gateway root (default: http://HOST:PORT from BIND_ADDR, 127.0.0.1:3000)"
    )
    routes.add_argument("--json", action="store_true", help="print the admin API's JSON as it is")
    routes.set_defaults(run=_routes)


async def _fetch(url: str, token: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(url, headers={"Authorization": f"Bearer {token}"}) as response,
    ):
        return response.status, await response.read()


def _when(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "-"
    return f"{epoch - now:+.0f}s"


def _print(view: dict[str, Any]) -> None:
    for alias in view["aliases"]:
        weights = f" weights={alias['weights']}" if alias["weights"] else ""
        print(
            f"alias {alias['alias']}: {alias['strategy']}{weights}: {', '.join(alias['deployments'])}"
        )
    now = time.time()
    print(
        f"{'deployment':<40} {'state':<9} {'open until':>10} {'failures':>8} {'in flight':>9} latency"
    )
    for d in view["deployments"]:
        latency = "-" if d["latency_seconds"] is None else f"{d['latency_seconds'] * 1000:.0f} ms"
        print(
            f"{d['deployment']:<40} {d['state']:<9} {_when(d['open_until'], now):>10} "
            f"{d['consecutive_failures']:>8} {d['in_flight']:>9} {latency}"
        )


def _routes(args: argparse.Namespace) -> int:
    token = os.environ.get("LLMGW_ADMIN_TOKEN", "").strip()
    if not token:
        raise CommandError("set LLMGW_ADMIN_TOKEN to the gateway's admin token", EXIT_CONFIG)
    root = args.url or default_base_url(load_bind_addr()).removesuffix("/v1")
    url = root.rstrip("/") + "/admin/v1/routes"
    try:
        status, body = asyncio.run(_fetch(url, token))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CommandError(f"cannot reach {url}: {type(exc).__name__}") from None
    if status != 200:
        raise CommandError(f"{url} answered {status}: {body.decode(errors='replace')[:200]}")
    if args.json:
        print(body.decode())
    else:
        _print(orjson.loads(body))
    return 0
