"""/demo/cron in the browser: "Run now" makes the count rise without a reload; a manual tick
held past the next tick makes that tick skip on the overlap guard, in the audit; bad input is
worded plainly; the page fits 390 px."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import LiveStack, log_in, screenshot
from tests.e2e.fields import HOLD, expect_field_error, expect_no_field_error

pytestmark = pytest.mark.e2e
OVERLAP = "overlap: the previous run still runs"


def test_run_now_raises_the_count_and_lands_in_history(page, live_stack: LiveStack) -> None:  # type: ignore[no-untyped-def]
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


def test_a_held_manual_tick_makes_the_next_tick_skip_on_the_overlap_guard(
    page, live_stack: LiveStack
) -> None:  # type: ignore[no-untyped-def]
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    # Hold just past the next tick (the page's suggestion, 35 s, always spans one; this is
    # the same thing, shorter).
    next_tick = datetime.fromisoformat(page.locator("#next-runs li").first.inner_text())
    until_next_ms = int((next_tick.timestamp() - time.time()) * 1000)
    if until_next_ms < 1500:  # too close to aim at: take the one after
        next_tick = datetime.fromisoformat(page.locator("#next-runs li").nth(1).inner_text())
        until_next_ms = int((next_tick.timestamp() - time.time()) * 1000)
    page.fill("#hold-ms", str(until_next_ms + 2500))
    page.click("#run-now")
    expect(page.locator("#run-result")).to_contain_text("holds the overlap guard until")
    page.fill("#hold-ms", "0")
    page.click("#run-now")  # a second manual tick meanwhile meets the same guard
    expect(page.locator("#run-result")).to_have_text(f"Manual tick skipped: {OVERLAP}.")
    tick = page.locator("#ticks tbody tr", has_text=next_tick.strftime("%H:%M:%S"))
    expect(tick).to_contain_text(OVERLAP, timeout=40_000)
    expect(tick.locator("td").nth(1)).to_have_text("none")  # no winner: nobody ran it
    screenshot(page, "cron-overlap")


def test_bad_hold_is_worded_plainly_and_the_page_fits_390_px(page, live_stack: LiveStack) -> None:  # type: ignore[no-untyped-def]
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    before = page.locator("#count").inner_text()
    # Each one reads the same sentence with the range: text, below, above, 23 digits.
    for typed in ("soon", "-5", "70000", "1" * 23):
        page.fill("#hold-ms", typed)
        page.click("#run-now")
        expect_field_error(page, "#hold-ms", HOLD)
        expect(page.locator("#run-result")).to_have_text("")
    expect(page.locator("#count")).to_have_text(before)
    page.fill("#hold-ms", "0")
    page.click("#run-now")  # ran, or skipped if an earlier test's hold still runs: either way
    expect(page.locator("#run-result")).to_contain_text("Manual tick")
    expect_no_field_error(page, "#hold-ms")
    expect(page.locator("#ticks tbody tr").first).to_be_visible()
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    screenshot(page, "cron-390")
