"""Log in through the form and see the console; log out. The console's charts after real jobs
run, short instance ids, the demo cards' rows, and the page at 390 px."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import ONE_BUS, LiveStack, log_in, screenshot
from tests.e2e.geometry import per_row

pytestmark = pytest.mark.e2e


def test_login_shows_console_and_logout_returns_to_login(page: Page, live_stack: LiveStack) -> None:
    page.goto(live_stack.url + "/demo")
    assert "/login?next=/demo" in page.url
    screenshot(page, "login")
    log_in(page, live_stack.url)
    assert page.locator("h1").inner_text() == "Console"
    for link in ("Schedules", "Jobs", "CPU worker"):
        assert page.locator("nav").get_by_text(link).is_visible()
    screenshot(page, "console")
    page.click("text=Log out")
    page.wait_for_url("**/login")
    page.goto(live_stack.url + "/demo")
    assert "/login" in page.url


@ONE_BUS
@pytest.mark.parametrize(
    ("width", "demos", "panels"),
    [
        (1280, [4], [2, 2]),
        (900, [2, 2], [2, 2]),
        (600, [2, 2], [1, 1, 1, 1]),
        (390, [1, 1, 1, 1], [1, 1, 1, 1]),
    ],
)
def test_the_four_demo_cards_and_the_four_live_panels_fill_their_rows_evenly(
    page: Page, live_stack: LiveStack, width: int, demos: list[int], panels: list[int]
) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, live_stack.url)
    # Never three in a row with the fourth left alone below.
    assert per_row(page, "#demos > .card") == demos
    assert per_row(page, "#console > .card") == panels


@ONE_BUS
def test_wrong_password_shows_generic_error(page: Page, live_stack: LiveStack) -> None:
    page.goto(live_stack.url + "/login")
    page.fill("input[name=username]", "demo")
    page.fill("input[name=password]", "not-it")
    page.click("button[type=submit]")
    assert "Wrong username or password" in page.locator(".alert").inner_text()


def enqueue_from_page(page: Page, mode: str, count: int) -> None:
    """Enqueue through the JSON route with the page's session and CSRF token (mega.api)."""
    statuses = page.evaluate(
        """async ([mode, count]) => {
            const out = [];
            for (let i = 0; i < count; i++) {
                const body = {to: "chart@example.com", mode};
                out.push((await mega.api("POST", "/api/demo/jobs", body)).status);
            }
            return out;
        }""",
        [mode, count],
    )
    assert statuses == [201] * count


def test_charts_draw_jobs_latency_and_dlq_after_jobs_run(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    enqueue_from_page(page, "ok", 5)
    enqueue_from_page(page, "fail", 1)

    jobs = page.locator("#chart-jobs")
    expect(jobs.locator("[data-plot]")).to_be_visible(timeout=20_000)
    expect(jobs.locator("[data-empty]")).to_be_hidden()
    expect(jobs.locator("path.chart-line")).to_have_attribute("d", re.compile(r"^M\d"))
    expect(jobs.locator("svg[role=img]")).to_have_attribute(
        "aria-label", re.compile("per second now")
    )
    expect(jobs.locator(".chart-ymax")).to_have_text(re.compile(r"^\d+(\.\d+)?/s$"))

    latency = page.locator("#chart-latency")
    expect(latency.locator("[data-latest]")).to_have_text(
        re.compile(r"^p50 [\d.]+ ms · p99 [\d.]+ ms$")
    )
    assert latency.locator("path.chart-line").count() == 2

    dlq = page.locator("#chart-dlq")  # three attempts with backoff, then the DLQ
    expect(dlq.locator("[data-plot]")).to_be_visible(timeout=30_000)
    assert int(dlq.locator("[data-latest]").inner_text()) >= 1
    # A drawn line; whether it steps up inside the window depends on what earlier tests on
    # the shared stack left in the DLQ.
    expect(dlq.locator("path.chart-line-bad")).to_have_attribute("d", re.compile(r"^M\d"))
    worker = page.locator("#worker-instances tbody td").first  # the worker that ran them
    expect(worker).to_have_text(re.compile(r"^[0-9a-f]{6} \(pid \d+\)$"))
    expect(worker).to_have_attribute("title", re.compile(r"^worker@"))
    screenshot(page, "console-charts")

    # The next refreshes morph the drawn nodes in place: the same path and row objects remain.
    page.evaluate("""() => {
        window.keptPath = document.querySelector("#chart-jobs path.chart-line");
        window.keptRow = document.querySelector("#events-groups tbody tr");
    }""")
    for _ in range(3):  # the page asks again only after drawing the last answer
        with page.expect_request("**/api/demo/console"):
            pass
    kept = page.evaluate("""() => [
        window.keptPath === document.querySelector("#chart-jobs path.chart-line"),
        window.keptRow === document.querySelector("#events-groups tbody tr"),
    ]""")
    assert kept == [True, True]


@ONE_BUS
def test_console_fits_390_px_without_horizontal_scroll(page: Page, live_stack: LiveStack) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_stack.url)
    expect(page.locator("#chart-jobs")).to_be_visible()
    expect(page.locator("#charts svg").first).to_be_attached()
    # With the instances table filled in too (after the first scheduled tick).
    expect(page.locator("#sched-instance-list tbody tr").first).to_be_visible(timeout=40_000)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the console is {width} px wide at 390"
    for chart in page.locator(".chart").all():
        box = chart.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    screenshot(page, "console-mobile")


@ONE_BUS
def test_instances_show_short_ids_with_the_full_id_in_the_title(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    cell = page.locator("#sched-instance-list tbody td").first
    expect(cell).to_be_visible(timeout=40_000)  # after the first scheduled tick
    full, short = cell.get_attribute("title"), cell.inner_text()
    assert full and full.startswith("scheduler@")
    _, pid, suffix = full.split(":")
    assert short == f"{suffix} (pid {pid})"
    row = page.locator("#sched-instance-list tbody tr").first
    expect(row.locator(".badge")).to_have_text("ticking")
