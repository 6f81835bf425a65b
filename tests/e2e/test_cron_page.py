"""/demo/cron in the browser: "Run now" makes the count rise without a reload."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import LiveStack, log_in, screenshot

pytestmark = pytest.mark.e2e


def test_run_now_raises_the_count_and_lands_in_history(page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    before = int(page.locator("#count").inner_text())
    page.click("#run-now")
    expect(page.locator("#run-result")).to_have_text("Manual tick ran.")
    expect(page.locator("#count")).not_to_have_text(str(before))
    assert int(page.locator("#count").inner_text()) > before
    assert page.locator("#history tbody tr").first.locator(".badge").inner_text() == "manual"
    assert page.locator("#next-runs li").count() == 5
    assert "+09:00" in page.locator("#next-runs li").first.inner_text()
    screenshot(page, "cron")
