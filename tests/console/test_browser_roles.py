"""The console in Chromium for each role, signed in through the test OpenID provider: an admin
sees every page; a team admin and a member see their keys, create one in their team, and are
refused what their role does not allow; nobody gets the no-access page."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, expect

from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN
from tests.console.test_browser import browser, pytestmark  # noqa: F401  (fixture, marks)
from tests.oidc_provider import OidcProvider, oidc_provider  # noqa: F401  (the provider fixture)

GROUPS = {"admin": ["platform"], "team admin": ["ml-leads"], "member": ["ml"], "nobody": ["x"]}


@pytest.fixture
async def sso(start_gateway: Any, provider: OidcProvider) -> tuple[Gateway, str]:
    gateway: Gateway = await start_gateway(
        admin_token=ADMIN_TOKEN, **provider.gateway_settings("platform")
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/admin/v1/teams"),
            json={"name": "ml", "oidc_group": "ml", "oidc_admin_group": "ml-leads"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        team = await response.json()
    return gateway, team["id"]


@pytest.mark.parametrize("role", list(GROUPS))
async def test_each_role_in_the_console(
    role: str,
    sso: tuple[Gateway, str],
    provider: OidcProvider,
    browser: Browser,  # noqa: F811
) -> None:
    gateway, team_id = sso
    provider.person = {"sub": "u-ada", "email": "ada@example.com", "groups": GROUPS[role]}
    page = await browser.new_page()
    await page.goto(gateway.url("/console/sign-in"))
    await page.get_by_role("link", name="Sign in with single sign-on").click()
    if role == "nobody":
        await expect(page.get_by_role("alert")).to_contain_text("No access")
        return
    nav = page.get_by_role("navigation", name="Console pages")
    if role == "admin":
        await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        await expect(nav.get_by_role("link", name="Subjects")).to_be_visible()
        return
    await expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    await expect(nav.get_by_role("link", name="Overview")).to_be_hidden()
    await expect(nav.get_by_role("link", name="Subjects")).to_be_hidden()
    form = page.get_by_role("form", name="Create key")
    await form.get_by_label("Name").fill(f"{role} key")
    await form.get_by_label("Team ID (optional)").fill(team_id)
    await form.get_by_role("button", name="Create key").click()
    await expect(page.get_by_role("status")).to_contain_text("created")
    await expect(page.get_by_role("cell", name=f"{role} key", exact=True)).to_be_visible()
    await nav.get_by_role("link", name="Audit").click()
    if role == "member":  # not the audit log
        await expect(page.get_by_role("alert")).to_contain_text("does not allow audit.read")
    else:
        await expect(page.get_by_role("heading", name="Audit")).to_be_visible()
