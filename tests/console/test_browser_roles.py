"""The console in Chromium for each role, signed in through the test OpenID provider: an admin
sees every page; a team admin and a member see their keys, create one in their team, see the usage
of their keys (a team admin: of their team) without typing an id, and are refused what their role
does not allow; nobody gets the no-access page."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, expect

from llmgw.storage.usage import write_batch
from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN
from tests.console.test_browser import browser, pytestmark  # noqa: F401  (fixture, marks)
from tests.oidc_provider import OidcProvider, oidc_provider  # noqa: F401  (the provider fixture)
from tests.usage_records import usage_record

GROUPS = {"admin": ["platform"], "team admin": ["ml-leads"], "member": ["ml"], "nobody": ["x"]}


@pytest.fixture
async def sso(start_gateway: Any, provider: OidcProvider) -> tuple[Gateway, str]:
    gateway: Gateway = await start_gateway(
        admin_token=ADMIN_TOKEN, **provider.gateway_settings("platform")
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession(headers=admin) as session:
        async with session.post(
            gateway.url("/admin/v1/teams"),
            json={"name": "ml", "oidc_group": "ml", "oidc_admin_group": "ml-leads"},
        ) as response:
            team = await response.json()
        # Someone else's key in the team, used once: its team admin sees it, a member does not.
        async with session.post(
            gateway.url("/admin/v1/keys"), json={"name": "bob's key", "team_id": team["id"]}
        ) as response:
            theirs = await response.json()
    await write_batch(gateway.db, [usage_record(api_key_id=uuid.UUID(theirs["id"]), model="bob-m")])
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
    await expect(form.get_by_label("Subject ID (optional)")).to_have_count(0)  # an admin's
    await expect(form.get_by_label("Team ID (optional)")).to_have_value(team_id)  # theirs
    await form.get_by_label("Name").fill(f"{role} key")
    await form.get_by_role("button", name="Create key").click()
    await expect(page.get_by_role("status")).to_contain_text("created")
    await expect(page.get_by_role("cell", name=f"{role} key", exact=True)).to_be_visible()

    # Their usage, without typing an id: a member picks among their keys, a team admin their team
    # (every key in it) or one of its keys.
    mine = await gateway.db.fetchval("SELECT id FROM api_keys WHERE name = $1", f"{role} key")
    await write_batch(gateway.db, [usage_record(api_key_id=mine, model="my-m")])
    await page.get_by_role("button", name=f"Usage of {role} key").click()
    await expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
    of = page.get_by_label("Usage of")
    options = await of.locator("option").all_text_contents()
    assert (any("bob's key" in o for o in options), "Team ml (all its keys)" in options) == (
        (role == "team admin",) * 2
    )
    assert (await of.locator("option:checked").text_content() or "").startswith(f"Key {role} key")
    await page.get_by_label("Group by").select_option("model")
    await page.get_by_role("button", name="Show usage").click()
    usage = page.get_by_role("table", name="Usage by model")
    await expect(usage.get_by_role("cell", name="my-m", exact=True)).to_be_visible()
    await expect(usage.get_by_role("cell", name="bob-m", exact=True)).to_have_count(0)
    if role == "team admin":
        await of.select_option(label="Team ml (all its keys)")
        await page.get_by_role("button", name="Show usage").click()
        await expect(usage.get_by_role("cell", name="bob-m", exact=True)).to_be_visible()
        await expect(usage.get_by_role("cell", name="my-m", exact=True)).to_be_visible()
    # Editing a key's limits is a team admin's.
    await nav.get_by_role("link", name="Keys").click()
    edit = page.get_by_role("button", name=f"Edit limits of {role} key")
    await expect(edit).to_have_count(1 if role == "team admin" else 0)
    await nav.get_by_role("link", name="Audit").click()
    if role == "member":  # not the audit log
        await expect(page.get_by_role("alert")).to_contain_text("does not allow audit.read")
    else:
        await expect(page.get_by_role("heading", name="Audit")).to_be_visible()
