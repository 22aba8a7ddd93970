"""The console driven by a real browser (Debian's Chromium through Playwright), end to end.

Screenshots of every page go to build/console-screenshots/ (or $LLMGW_SCREENSHOT_DIR).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN, wait_for_usage

CHROMIUM = "/usr/bin/chromium"
# As the machine notes say: without the background-networking flags Chromium keeps dialling out.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(
    os.environ.get(
        "LLMGW_SCREENSHOT_DIR", Path(__file__).parents[2] / "build" / "console-screenshots"
    )
)

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (.ci/run installs it)",
)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    await asyncio.to_thread(SCREENSHOTS.mkdir, parents=True, exist_ok=True)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


async def shot(page: Page, name: str) -> None:
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


async def test_an_operator_runs_the_gateway_from_the_console(
    console_gateway: Gateway, browser: Browser, tmp_path: Path
) -> None:
    context = await browser.new_context(
        accept_downloads=True, viewport={"width": 1280, "height": 900}
    )
    page = await context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())

    # Signing in.
    await page.goto(console_gateway.url("/console"))
    await expect(page).to_have_url(console_gateway.url("/console/sign-in"))
    await shot(page, "sign-in")
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()

    # A key, shown once.
    await page.get_by_role("link", name="Keys").click()
    await expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    await page.get_by_label("Name", exact=True).fill("console-made")
    await page.get_by_role("button", name="Create key").click()
    plaintext = (await page.get_by_test_id("plaintext-key").text_content() or "").strip()
    assert plaintext.startswith("llmg_")
    await expect(page.get_by_role("button", name="Copy key")).to_be_visible()
    await shot(page, "keys-created")
    await page.reload()
    await expect(page.get_by_role("cell", name="console-made", exact=True)).to_be_visible()
    assert plaintext not in await page.content()

    # The key works through the gateway, and the request shows up.
    client = openai.AsyncOpenAI(base_url=console_gateway.base_url, api_key=plaintext, max_retries=0)
    await client.chat.completions.create(
        model="qwen3-5-9b", messages=[{"role": "user", "content": "hello console"}]
    )
    await wait_for_usage(console_gateway.db, 1)
    await page.get_by_role("link", name="Overview").click()
    await expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible()
    last_hour = page.get_by_role("table", name="Requests in the last 60 minutes, per model")
    await expect(last_hour.get_by_role("cell", name="qwen3-5-9b", exact=True)).to_be_visible()
    await expect(page.get_by_text("Requests, last hour")).to_be_visible()
    await shot(page, "overview")

    await page.get_by_role("link", name="Usage").click()

    await expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
    await page.get_by_label("Group by").select_option("model")
    await page.get_by_role("button", name="Show usage").click()
    usage = page.get_by_role("table", name="Usage by model")
    await expect(usage.get_by_role("cell", name="qwen3-5-9b", exact=True)).to_be_visible()
    await shot(page, "usage")
    async with page.expect_download() as waiting:
        await page.get_by_role("link", name="Export CSV").click()
    download = await waiting.value
    saved = tmp_path / "usage.csv"
    await download.save_as(saved)
    lines = saved.read_text().splitlines()
    assert lines[0].startswith("model,requests,errors,input_tokens")
    assert lines[1].startswith("qwen3-5-9b,1,0,")

    # Revoked from its row: the next chat is refused.
    await page.get_by_role("link", name="Keys").click()
    await expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    await page.get_by_role("button", name="Revoke console-made").click()
    await expect(page.get_by_role("cell", name="revoked", exact=True)).to_be_visible()
    await shot(page, "keys-revoked")
    refused: list[int] = []

    async def chat_refused() -> bool:
        try:
            await client.chat.completions.create(
                model="qwen3-5-9b", messages=[{"role": "user", "content": "again"}]
            )
        except openai.AuthenticationError:
            return True
        return False

    for _ in range(60):
        if await chat_refused():
            refused.append(401)
            break
        await page.wait_for_timeout(50)
    assert refused == [401]

    # A budget, and its bar.
    subject = uuid.uuid4()
    await page.get_by_role("link", name="Subjects").click()
    await expect(page.get_by_role("heading", name="Subjects", exact=True)).to_be_visible()
    await page.get_by_label("Subject ID").fill(str(subject))
    await page.get_by_label("Monthly budget (USD)").fill("25")
    await page.get_by_role("button", name="Set budget").click()
    bar = page.get_by_role("meter", name=f"Spend of {subject}: $0.00 of $25.00")
    await expect(bar).to_be_visible()
    await shot(page, "subjects")

    await page.get_by_role("link", name="Audit").click()

    await expect(page.get_by_role("heading", name="Audit", exact=True)).to_be_visible()
    audit = page.get_by_role("table", name="Admin changes, newest first")
    await expect(audit.get_by_role("cell", name="subject.budget", exact=True)).to_be_visible()
    await expect(audit.get_by_role("cell", name="key.revoke", exact=True)).to_be_visible()
    await shot(page, "audit")

    # A narrow screen still reads.
    await page.set_viewport_size({"width": 380, "height": 800})
    await page.get_by_role("link", name="Keys").click()
    await expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    await expect(page.get_by_role("button", name="Create key")).to_be_visible()
    await shot(page, "keys-narrow")

    await page.get_by_role("button", name="Sign out", exact=True).click()
    await expect(page.get_by_label("Admin token")).to_be_visible()
    await context.close()
