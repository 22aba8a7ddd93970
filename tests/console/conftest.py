"""A gateway with the console on, and a signed-in HTTP session for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.conftest import Gateway
from tests.processes import eventually

ADMIN_TOKEN = "console-admin-token-for-tests-0123456789"


@pytest.fixture
async def console_gateway(start_gateway: Any) -> Gateway:
    gateway: Gateway = await start_gateway(admin_token=ADMIN_TOKEN)
    return gateway


@pytest.fixture
async def browser_session() -> AsyncIterator[aiohttp.ClientSession]:
    """Like a browser: keeps cookies (also for 127.0.0.1), follows no redirects unless asked."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session


async def sign_in(gateway: Gateway, session: aiohttp.ClientSession) -> str:
    """Sign in with the admin token; returns the CSRF token rendered into the console page."""
    async with session.post(
        gateway.url("/console/sign-in"), data={"token": ADMIN_TOKEN}, allow_redirects=False
    ) as response:
        assert response.status == 303, await response.text()
    return await console_csrf(gateway, session)


async def console_csrf(gateway: Gateway, session: aiohttp.ClientSession) -> str:
    """The signed-in session's CSRF token, as the console page carries it."""
    async with session.get(gateway.url("/console/")) as response:
        assert response.status == 200
        page = await response.text()
    marker = 'name="csrf-token" content="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


async def wait_for_count(
    db: asyncpg.Connection, query: str, at_least: int, *, within: float = 5.0
) -> None:
    """Wait until ``query`` counts ``at_least`` (the ledger and the refusal counts are written in
    the background)."""

    async def reached() -> bool:
        return bool(await db.fetchval(query) >= at_least)

    await eventually(reached, within=within, what=f"{query} reaches {at_least}")


async def wait_for_usage(db: asyncpg.Connection, requests: int) -> None:
    """Wait until the ledger has written ``requests`` requests into the hourly rollup."""
    await wait_for_count(db, "SELECT coalesce(sum(requests), 0) FROM usage_hourly", requests)
