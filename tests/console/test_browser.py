"""The console driven by a real browser (Debian's Chromium through Playwright), end to end.

Screenshots of every page, with one day and with thirty days of data, go to $LLMGW_TEST_SCREENSHOTS
(default: a pytest temporary directory; the path is printed, ``pytest -s`` shows it).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

from llmgw import app_keys
from llmgw.storage import api_keys, subjects
from llmgw.storage.usage import write_batch
from tests.conftest import Gateway
from tests.console.conftest import ADMIN_TOKEN, wait_for_count, wait_for_usage
from tests.fake_venice import Behaviour
from tests.usage_records import usage_record

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

pytestmark = [
    pytest.mark.skipif(
        shutil.which(CHROMIUM) is None and not os.environ.get("CI"),
        reason="Debian's chromium is not installed (.ci/run installs it)",
    ),
    pytest.mark.slow,  # a browser (Chromium) driving the console: pytest -m slow
]


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("LLMGW_TEST_SCREENSHOTS")
    directory = Path(chosen) if chosen else tmp_path_factory.mktemp("console-screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {directory}")
    return directory


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
def shot(screenshots: Path) -> Callable[[Page, str], Awaitable[None]]:
    async def take(page: Page, name: str) -> None:
        await page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)

    return take


Shot = Callable[[Page, str], Awaitable[None]]


async def test_an_operator_runs_the_gateway_from_the_console(
    console_gateway: Gateway, browser: Browser, tmp_path: Path, shot: Shot
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
    client = console_gateway.client(plaintext)
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
    bar = page.get_by_role(
        "meter", name=f"Spend of {subject}: $0.00 settled, $0.00 reserved, of $25.00"
    )
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


# ---------------------------------------------------------------------------------------------
# Charts and the pages' figures, with one day and with thirty days of data


def _day_of_usage(day: datetime, keys: list[api_keys.ApiKeyRecord], scale: int) -> list[Any]:
    """A few requests in several hours of ``day`` (UTC) for each key, two models, one error."""
    records = []
    for index, hour in enumerate((2, 9, 13, 17, 21)):
        for key in keys:
            for n in range(scale + index):
                records.append(
                    usage_record(
                        occurred_at=day.replace(hour=hour, minute=n % 60),
                        api_key_id=key.id,
                        subject_id=key.subject_id,
                        model="qwen3-5-9b" if n % 3 else "llama-3.2-3b",
                        status=502 if (n == 0 and index == 2) else 200,
                        input_tokens=40 + n,
                        output_tokens=80 + 2 * n,
                        cost_usd=0.0004 * (1 + n % 4),
                        duration_ms=120.0 + 40 * n,
                    )
                )
    return [r for r in records if r.occurred_at <= datetime.now(UTC)]


async def _sign_in(page: Page, gateway: Gateway) -> None:
    await page.goto(gateway.url("/console/sign-in"))
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()


async def _open(page: Page, name: str) -> None:
    await page.get_by_role("link", name=name, exact=True).click()
    await expect(page.get_by_role("heading", name=name, exact=True)).to_be_visible()


async def _check_chart(page: Page, title: str, bars: int, *, zero_bars: int | None = None) -> None:
    """The chart's axes, bars (one per period, zeros included), keyboard focus and text twin."""
    figure = page.get_by_role("figure", name=title)
    await expect(figure).to_be_visible()
    chart = figure.get_by_role("group", name=title)
    drawn = chart.locator("g.bar")
    await expect(drawn).to_have_count(bars)
    if zero_bars is not None:
        await expect(chart.locator('g.bar[data-value="0"]')).to_have_count(zero_bars)
    # A y axis with values, starting at 0, and labels along the x axis.
    ticks = await chart.locator(".tick text").all_text_contents()
    values = [float(tick.lstrip("$").replace(",", "")) for tick in ticks]
    assert len(values) >= 2 and values[0] == 0 and values == sorted(values), ticks
    assert await chart.locator("text.x-label").count() >= 2
    # One tab stop (the last bar); the arrow keys move along, the focused bar shows its value.
    assert await chart.locator('g.bar[tabindex="0"]').count() == 1
    readout = chart.locator("g.readout")
    await expect(readout).to_be_hidden()
    last, previous = drawn.nth(bars - 1), drawn.nth(bars - 2)
    await last.focus()
    await expect(readout).to_be_visible()
    await _readout_matches(readout, last)
    await page.keyboard.press("ArrowLeft")
    await expect(previous).to_be_focused()
    await _readout_matches(readout, previous)
    await page.keyboard.press("End")
    await expect(last).to_be_focused()
    # Hovering shows a bar's value too.
    await drawn.nth(0).locator("rect.hit").hover()
    await _readout_matches(readout, drawn.nth(0))
    await page.mouse.move(0, 0)
    await page.evaluate("document.activeElement.blur()")
    await expect(readout).to_be_hidden()
    # The text alternative: every bar's figure in a (visually hidden) table, and a summary.
    twin = figure.locator(".visually-hidden table")
    await expect(twin.locator("tbody tr")).to_have_count(bars)
    assert await twin.locator("caption").text_content() == title
    summary = page.locator(f"#{await chart.get_attribute('aria-describedby')}")
    await expect(summary).to_contain_text(re.compile(r"^\d+ bars.*; total "))


async def _readout_matches(readout: Locator, bar: Locator) -> None:
    """The readout shows the bar's value, as its accessible name states it."""
    label = await bar.get_attribute("aria-label") or ""
    value = label.split(": ", 1)[1].removesuffix(" requests")
    await expect(readout).to_have_text(re.compile(f": {re.escape(value)}$"))


async def test_charts_read_like_charts_with_one_day_and_thirty_days_of_data(
    start_gateway: Any, browser: Browser, shot: Shot
) -> None:
    # A long request timeout: one request stays in flight (reserving budget) through the test.
    gateway: Gateway = await start_gateway(admin_token=ADMIN_TOKEN, request_timeout_seconds=300)
    db = gateway.db
    subject = uuid.uuid4()
    await subjects.set_budget(db, subject, 20.0)
    settings = api_keys.KeySettings
    alpha = (await api_keys.create_key(db, settings(name="team-alpha", subject_id=subject))).record
    beta = (
        await api_keys.create_key(
            db,
            settings(
                name="team-beta",
                tokens_per_minute=50_000,
                max_concurrent_requests=4,
                allowed_models=("qwen3-5-9b", "llama-3.2-3b"),
            ),
        )
    ).record
    old, new = await api_keys.rotate_key(db, str(beta.id), grace_seconds=3600)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    seeded = _day_of_usage(today, [alpha, beta], 3)
    await write_batch(db, seeded)

    # Refused by the gateway itself: a 429 (window of one request) and a 413 (too large a body).
    limited = await gateway.create_key(name="limited", rate_limit_requests=1)
    client = gateway.client(limited)
    chat: dict[str, Any] = {"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]}
    await client.chat.completions.create(**chat)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(**chat)
    big = gateway.client(await gateway.create_key(name="big"))
    limit = gateway.server.app[app_keys.SETTINGS].request_body_limit_bytes
    with pytest.raises(openai.APIStatusError) as too_large:
        await big.chat.completions.create(**chat, user="x" * limit)
    assert too_large.value.status_code == 413

    # A request of the subject in flight holds its worst case against the budget.
    gateway.fake.enqueue(Behaviour(delay_before_headers=300))
    alpha_key = await gateway.create_key(name="alpha-live", subject_id=subject)
    live = gateway.client(alpha_key)
    in_flight = asyncio.create_task(live.chat.completions.create(**chat))

    # Refusal counts are written every few seconds.
    query = "SELECT coalesce(sum(requests), 0) FROM refusals_by_minute"
    await wait_for_count(db, query, 2, within=10)
    await wait_for_usage(db, len(seeded) + 1)  # and the limited key's one answered request
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await _sign_in(page, gateway)
    try:
        for days in (1, 30):
            if days == 30:
                for back in range(1, 30):
                    day = today - timedelta(days=back)
                    await write_batch(db, _day_of_usage(day, [alpha, beta], 1 + back % 7))
            suffix = f"{days}-day" if days == 1 else f"{days}-days"

            # Overview: 24 hours, zero-filled, with refusals in the error counts.
            await _open(page, "Overview")
            await expect(page.get_by_text("2 refused by the gateway").first).to_be_visible()
            refused = page.get_by_role(
                "table", name="Refused since midnight UTC, by status and code"
            )
            await expect(refused.get_by_role("cell", name="rate_limit_exceeded")).to_be_visible()
            await expect(refused.get_by_role("cell", name="request_too_large")).to_be_visible()
            await _check_chart(page, "Requests per hour, last 24 hours (UTC)", 24)
            await _check_chart(page, "Spend per hour, last 24 hours (UTC)", 24)
            health = page.get_by_role(
                "table", name="Deployment health, as the replica that answered sees it"
            )
            row = health.get_by_role("row").filter(has_text="venice:qwen3-5-9b")
            await expect(row.get_by_role("cell", name="closed", exact=True)).to_be_visible()
            await shot(page, f"overview-{suffix}")

            # Usage per day: the chosen 30-day range is the x axis, days without traffic at 0.
            await _open(page, "Usage")
            end = (today + timedelta(days=1)).date()
            start = end - timedelta(days=30)
            title = f"Requests per day, {start} to {end} (UTC, end exclusive)"
            await _check_chart(page, title, 30, zero_bars=29 if days == 1 else 0)
            spend = f"Spend per day, {start} to {end} (UTC, end exclusive)"
            await _check_chart(page, spend, 30, zero_bars=29 if days == 1 else 0)
            await shot(page, f"usage-by-day-{suffix}")
            await (
                page.locator("svg.chart g.bar").nth(25).focus()
            )  # its value, as a keyboard shows it
            await shot(page, f"usage-by-day-focused-{suffix}")
            await page.evaluate("document.activeElement.blur()")
            # Per hour over the last three days: 72 hours, the quiet ones at 0.
            await page.get_by_label("Group by").select_option("hour")
            await page.get_by_label("From (UTC day)").fill(str(end - timedelta(days=3)))
            await page.get_by_role("button", name="Show usage").click()
            hourly = f"Requests per hour, {end - timedelta(days=3)} to {end} (UTC, end exclusive)"
            await _check_chart(page, hourly, 72)
            await shot(page, f"usage-by-hour-{suffix}")
            await page.get_by_label("From (UTC day)").fill(str(start))
            # Usage by key names the keys.
            await page.get_by_label("Group by").select_option("key")
            await page.get_by_role("button", name="Show usage").click()
            by_key = page.get_by_role("table", name="Usage by key")
            await expect(
                by_key.get_by_role("cell", name=f"team-alpha ({alpha.prefix})", exact=True)
            ).to_be_visible()
            await expect(
                by_key.get_by_role("cell", name=f"team-beta ({beta.prefix})", exact=True)
            ).to_be_visible()
            await _check_chart(page, f"Requests by key, {start} to {end} (UTC, end exclusive)", 3)
            await shot(page, f"usage-by-key-{suffix}")
            await page.get_by_label("Group by").select_option("day")
            await page.get_by_role("button", name="Show usage").click()

            # Keys: the limits in their own columns; the rotated key in its grace period.
            await _open(page, "Keys")
            keys = page.get_by_role("table", name=re.compile("^Keys "))
            for header in ("Requests", "Tokens per minute", "Concurrency", "Allowed models"):
                await expect(
                    keys.get_by_role("columnheader", name=header, exact=True)
                ).to_be_visible()
            row = keys.get_by_role("row").filter(has=page.get_by_text(old.prefix, exact=True))
            await expect(
                row.get_by_text(f"rotated by {new.record.prefix}, in grace period")
            ).to_be_visible()
            await expect(row.get_by_role("cell", name="50,000", exact=True)).to_be_visible()
            await expect(row.get_by_role("cell", name="4", exact=True)).to_be_visible()
            await expect(
                row.get_by_role("cell", name="qwen3-5-9b, llama-3.2-3b", exact=True)
            ).to_be_visible()
            await shot(page, f"keys-{suffix}")

            # Subjects: settled spend and the in-flight reservation, apart.
            await _open(page, "Subjects")
            bar = page.get_by_role("meter", name=re.compile(f"^Spend of {subject}: "))
            label = await bar.get_attribute("aria-label") or ""
            reserved = re.search(r"\$([0-9.]+) reserved", label)
            settled = re.search(r"\$([0-9.]+) settled", label)
            assert reserved and float(reserved[1]) > 0, label
            assert settled and float(settled[1]) > 0, label
            await expect(bar.locator(".reserved")).to_be_visible()
            await shot(page, f"subjects-{suffix}")

            await _open(page, "Audit")
            await shot(page, f"audit-{suffix}")

        # A narrow screen: the charts are drawn to its width and still read.
        await page.set_viewport_size({"width": 380, "height": 800})
        await _open(page, "Overview")
        await _check_chart(page, "Requests per hour, last 24 hours (UTC)", 24)
        await shot(page, "overview-narrow-30-days")
        await _open(page, "Usage")
        await _check_chart(page, title, 30, zero_bars=0)
        await shot(page, "usage-narrow-30-days")
    finally:
        in_flight.cancel()
        await context.close()


async def test_a_page_left_before_its_data_came_never_replaces_the_next_one(
    console_gateway: Gateway, browser: Browser
) -> None:
    page = await (await browser.new_context()).new_page()
    await _sign_in(page, console_gateway)
    # The overview's data held back until the keys page is drawn: it must not be drawn over it.
    held: list[Any] = []
    arrived = asyncio.Event()

    async def hold(route: Any) -> None:
        held.append(route)
        arrived.set()

    await page.route("**/console/api/overview", hold)
    await page.get_by_role("link", name="Usage", exact=True).click()
    await expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
    await page.get_by_role("link", name="Overview", exact=True).click()
    await asyncio.wait_for(arrived.wait(), 10)
    await _open(page, "Keys")
    await held[0].continue_()
    name = page.get_by_label("Name", exact=True)
    await name.focus()
    await page.wait_for_load_state("networkidle")  # the overview's answer came and was read
    await expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    await expect(name).to_be_focused()
    assert await page.title() == "Keys · llmgw console"
