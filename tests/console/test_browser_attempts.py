"""A request's attempts in the console (issue 29, item 5): a request that failed over, looked up
by its id on the Usage page in Chromium, lists the deployment that failed and the one that
answered; an unknown id says so."""

from __future__ import annotations

from playwright.async_api import Browser, expect

from tests.conftest import Gateway
from tests.console.test_browser import (  # noqa: F401  (fixtures, marks)
    Shot,
    browser,
    pytestmark,
    screenshots,
    shot,
)
from tests.fake_venice import Behaviour, FakeVenice
from tests.test_ledger_attempts import (  # noqa: F401  (fixtures)
    ADMIN_TOKEN,
    OTHER,
    gateway,
    key,
    post,
    second,
)
from tests.test_stream_continuation import MODEL


async def test_a_failed_over_request_s_attempts_are_listed_on_the_usage_page(
    gateway: Gateway,  # noqa: F811
    key: str,  # noqa: F811
    fake_venice: FakeVenice,
    browser: Browser,  # noqa: F811
    shot: Shot,  # noqa: F811
) -> None:
    fake_venice.enqueue(Behaviour(status=503))
    request_id, _ = await post(gateway, key)
    await gateway.ledger_rows(1)
    page = await browser.new_page()
    await page.goto(gateway.url("/console/sign-in"))
    await page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    await page.get_by_role("link", name="Usage").click()

    await page.get_by_label("Request ID").fill(request_id)
    await page.get_by_role("button", name="Show attempts").click()
    summary = page.get_by_role("table", name=f"Request {request_id}", exact=True)
    await expect(summary.get_by_role("cell", name=f"prefill:{OTHER}")).to_be_visible()
    attempts = page.get_by_role("table", name=f"Attempts of request {request_id}, in order")
    rows = attempts.locator("tbody tr")
    await expect(rows).to_have_count(2)
    failed, answered = rows.nth(0), rows.nth(1)
    for cell in (f"first:{MODEL}", "failed", "503"):
        await expect(failed.get_by_role("cell", name=cell, exact=True).first).to_be_visible()
    for cell in (f"prefill:{OTHER}", "completed", "200", OTHER):
        await expect(answered.get_by_role("cell", name=cell, exact=True).first).to_be_visible()
    await shot(page, "usage-request-attempts")

    await page.get_by_label("Request ID").fill("no-such-request")
    await page.get_by_role("button", name="Show attempts").click()
    await expect(page.get_by_role("alert")).to_have_text(
        "No usage is recorded for request 'no-such-request'."
    )
    await page.close()
