"""A gateway with the console on, and a signed-in HTTP session for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.conftest import Gateway

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
    async with session.get(gateway.url("/console/")) as response:
        assert response.status == 200
        page = await response.text()
    marker = 'name="csrf-token" content="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


async def wait_for_usage(db: asyncpg.Connection, requests: int, *, within: float = 5.0) -> None:
    """Wait until the ledger has written ``requests`` requests into the hourly rollup."""
    query = "SELECT coalesce(sum(requests), 0) FROM usage_hourly"
    for _ in range(int(within / 0.05)):
        if await db.fetchval(query) >= requests:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the rollup did not reach {requests} requests within {within}s")
