"""/demo/cron in the browser: "Run now" makes the count rise without a reload; a manual tick
held past the next tick makes that tick skip on the overlap guard, in the audit; Pause makes the
next tick skip as "paused" and Resume gives the one after a winner again; its times are
UTC, labelled, and agree with the console's; bad input is worded plainly; the page fits 390 px and
its tick audit breaks no word and cuts no row."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import ONE_BUS, LiveStack, log_in, screenshot
from tests.e2e.fields import HOLD, expect_field_error, expect_no_field_error
from tests.e2e.geometry import broken_words, eventually, overflowing, whole_rows

pytestmark = [pytest.mark.e2e, ONE_BUS]
OVERLAP = "overlap: the previous run still runs"


def test_run_now_raises_the_count_and_lands_in_history(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    history = page.locator("#history tbody tr")

    def sources_of_new_rows() -> list[str]:
        keys = history.evaluate_all("(rs) => rs.map((r) => r.dataset.key)")
        return [key.split("|")[1] for key in keys if key not in rows_before]

    rows_before = set(history.evaluate_all("(rs) => rs.map((r) => r.dataset.key)"))
    before = int(page.locator("#count").inner_text())
    page.click("#run-now")
    expect(page.locator("#run-result")).to_have_text("Manual tick ran.")
    expect(page.locator("#count")).not_to_have_text(str(before))
    assert int(page.locator("#count").inner_text()) > before
    # Among the new rows (a scheduled tick may land just after it), a manual one.
    eventually(lambda: "manual" in sources_of_new_rows())
    assert page.locator("#next-runs li").count() == 5
    screenshot(page, "cron")


def test_times_are_utc_labelled_with_the_schedules_zone_beside_the_next_runs(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    assert "Times on this page are in UTC" in page.locator(".page-head").inner_text()
    assert page.locator("#history th").first.inner_text() == "at (UTC)"
    assert page.locator("#ticks th").first.inner_text() == "tick (UTC)"
    # Each next run: UTC, and the same instant in Asia/Seoul beside it (+9 h, all year).
    for item in page.locator("#next-runs li").all():
        seoul = datetime.fromisoformat(str(item.get_attribute("data-key")))
        utc = datetime.fromisoformat(str(item.locator("time").get_attribute("datetime")))
        assert utc == seoul and utc.utcoffset() == timedelta(0)
        assert item.inner_text() == (
            f"{utc:%H:%M:%S} UTC ({seoul:%H:%M:%S} Asia/Seoul)"
        ) and seoul.utcoffset() == timedelta(hours=9)
    first = page.locator("#next-runs li time").first.inner_text()
    expect(page.locator("#next-run")).to_have_text(re.compile(r"^\d\d:\d\d:\d\d UTC$"))
    assert page.locator("#next-run").inner_text() in (first, "-")

    # A manual tick: its time in the history, in the audit and on the console is one time.
    rows = page.locator("#ticks tbody tr")

    def keys() -> list[str]:
        return [str(key) for key in rows.evaluate_all("(rs) => rs.map((r) => r.dataset.key)")]

    before = keys()
    page.fill("#hold-ms", "0")
    page.click("#run-now")
    expect(page.locator("#run-result")).to_contain_text("Manual tick")
    # The new manual row (a scheduled tick may land meanwhile, in a row of its own).
    new = eventually(lambda: [k for k in keys() if k not in before and k.endswith("|manual")])
    assert len(new) == 1
    key = new[0]
    instant = key.split("|")[0]
    assert instant.endswith("+00:00")
    manual = page.locator(f'#ticks tbody tr[data-key="{key}"]')
    assert page.locator(f'#history tbody tr[data-key^="{instant}|manual"]').count() == 1
    clock = datetime.fromisoformat(instant).strftime("%H:%M:%S")
    assert manual.locator("td").first.inner_text().startswith(clock)
    page.goto(live_stack.url + "/demo")
    row = page.locator(f'#sched-ticks tr[data-key="manual {instant}"]')
    expect(row.locator("td").first).to_have_text(clock)
    assert page.locator("#sched-ticks th").first.inner_text() == "tick (UTC)"


@pytest.mark.parametrize("width", [390, 1280])
def test_the_tick_audit_breaks_no_word_and_its_scroll_box_shows_whole_rows(
    page: Page, live_stack: LiveStack, width: int
) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    # Enough manual ticks (the audit keeps 15) that the audit box scrolls.
    statuses = page.evaluate(
        """async () => {
            const out = [];
            for (let i = 0; i < 15; i++) {
                out.push((await mega.api("POST", "/api/demo/cron/run", {})).status);
            }
            return out;
        }"""
    )
    assert statuses == [200] * 15
    expect(page.locator("#ticks tbody tr")).to_have_count(15)
    cells = "#ticks td, #ticks th"
    assert broken_words(page, cells) == []
    assert overflowing(page, "#ticks td") == []
    assert overflowing(page, "#ticks") == [] and overflowing(page, ".scroll") == []
    assert page.locator("#ticks tbody tr").first.locator(".fence").count() in (0, 1)
    # At rest the box shows whole rows, and it does scroll (so some are below).
    shown = eventually(lambda: whole_rows(page, "#ticks-box"))
    assert 1 <= shown < 15
    assert eventually(lambda: whole_rows(page, "#history-box"))  # the history's box too
    screenshot(page, f"cron-audit-{width}")


def test_a_held_manual_tick_makes_the_next_tick_skip_on_the_overlap_guard(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    # Hold just past the next tick (the page's suggestion, 35 s, always spans one; this is
    # the same thing, shorter).
    runs = page.locator("#next-runs li time")
    next_tick = datetime.fromisoformat(str(runs.first.get_attribute("datetime")))
    until_next_ms = int((next_tick.timestamp() - time.time()) * 1000)
    if until_next_ms < 1500:  # too close to aim at: take the one after
        next_tick = datetime.fromisoformat(str(runs.nth(1).get_attribute("datetime")))
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


def test_bad_hold_is_worded_plainly_and_the_page_fits_390_px(
    page: Page, live_stack: LiveStack
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    # Nothing manual runs: the newest manual row stays the newest (the count may still rise,
    # and the capped history move on, as the cron ticks meanwhile).
    manual = page.locator('#history tbody tr[data-key*="|manual"]')
    before = manual.first.get_attribute("data-key") if manual.count() else None
    # Each one reads the same sentence with the range: text, below, above, 23 digits.
    for typed in ("soon", "-5", "70000", "1" * 23):
        page.fill("#hold-ms", typed)
        page.click("#run-now")
        expect_field_error(page, "#hold-ms", HOLD)
        expect(page.locator("#run-result")).to_have_text("")
    assert (manual.first.get_attribute("data-key") if manual.count() else None) == before
    page.fill("#hold-ms", "0")
    page.click("#run-now")  # ran, or skipped if an earlier test's hold still runs: either way
    expect(page.locator("#run-result")).to_contain_text("Manual tick")
    expect_no_field_error(page, "#hold-ms")
    expect(page.locator("#ticks tbody tr").first).to_be_visible()
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    screenshot(page, "cron-390")


def next_tick_key(page: Page) -> str:
    """The audit row key of the next planned tick at least 1.5 s away."""
    for run in page.locator("#next-runs li time").all():
        instant = str(run.get_attribute("datetime"))
        if datetime.fromisoformat(instant).timestamp() - time.time() > 1.5:
            return f"{instant}|schedule"
    raise AssertionError("no planned tick far enough ahead")


def test_pause_makes_the_next_tick_skip_as_paused_and_resume_ends_it(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/cron")
    expect(page.locator("#pause-badge")).to_have_text("ticking")
    try:
        page.click("#pause-button")
        expect(page.locator("#pause-badge")).to_have_text("paused")
        expect(page.locator("#pause-state")).to_contain_text("Paused by demo since ")
        expect(page.locator("#pause-button")).to_have_text("Resume")
        change = page.locator("#ticks tbody tr", has=page.locator(".badge", has_text="pause"))
        expect(change.first).to_contain_text("paused by demo")
        skipped = page.locator(f'#ticks tbody tr[data-key="{next_tick_key(page)}"]')
        expect(skipped).to_contain_text(": paused", timeout=40_000)
        expect(skipped.locator("td").nth(1)).to_have_text("none")  # nobody ran it
        screenshot(page, "cron-paused")
    finally:
        if page.locator("#pause-form").get_attribute("data-paused") == "true":
            page.click("#pause-button")
    expect(page.locator("#pause-badge")).to_have_text("ticking")
    expect(page.locator("#pause-state")).to_contain_text("Ticking. Resumed by demo at ")
    expect(page.locator("#pause-button")).to_have_text("Pause")
    ticking = page.locator(f'#ticks tbody tr[data-key="{next_tick_key(page)}"]')
    expect(ticking.locator("td").nth(1)).to_contain_text("scheduler", timeout=40_000)
    expect(ticking).not_to_contain_text("paused")
