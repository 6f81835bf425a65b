"""/demo/worker in the browser: the heartbeat keeps beating while the pool hashes.

The page's CPU pool lives in the web process and touches no bus, so these tests run on the
NATS stack only (the other pages run on NATS and on Redis)."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Browser, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from tests.e2e.conftest import LiveStack, log_in, screenshot
from tests.e2e.fields import (
    INLINE_CAP,
    ROUNDS,
    TIMEOUT,
    expect_field_error,
    expect_no_field_error,
)

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("live_stack", ["nats"], indirect=True)]
DIGEST = re.compile(r"^[0-9a-f]{64}$")
# A pool run these tests watch lasts about this long, whatever the machine's pace (a 2-core
# runner busy with the rest of the suite hashed 9,000,000 rounds in over 60 s, the route's cap).
WATCHED_RUN_S = 5.0


def rounds_for(seconds: float) -> int:
    """The rounds this machine hashes in about `seconds` now (timed here, on a short chain):
    long enough to watch, well within the route's 60 s cap."""
    sample = 200_000
    started = time.perf_counter()
    sha256_loop({"input": "mega", "rounds": sample})
    pace = sample / (time.perf_counter() - started)
    return min(MAX_ROUNDS, max(1_000_000, int(pace * seconds) // 100_000 * 100_000))


def open_worker_page(page: Page, live_stack: LiveStack) -> None:
    """The page, once its pool is full and idle: runs sent by a test before (the burst's, or
    the contract test's) have ended, so this test's runs start at once."""
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/worker")
    expect(page.locator("#heartbeat .beat").first).to_be_visible()
    expect(page.locator("#pool-size")).to_have_text("2", timeout=20_000)
    expect(page.locator("#pool-queued")).to_have_text("0", timeout=120_000)
    expect(page.locator("#pool-busy")).to_have_text("0", timeout=120_000)


@pytest.mark.timeout(300)
def test_pool_hash_keeps_the_heartbeat_going(page: Page, live_stack: LiveStack) -> None:
    open_worker_page(page, live_stack)
    rounds = rounds_for(WATCHED_RUN_S)
    page.fill("#hash-rounds", str(rounds))
    page.click("#run-pool")
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=120_000)
    assert page.locator("#result-mode").inner_text() == "pool"
    beats = int(page.locator("#beats-during").get_attribute("data-final") or "0")
    assert beats > 1, "heartbeats must keep arriving while the pool hashes"
    assert len(page.locator("#result-digest").inner_text()) == 64
    assert page.locator("#result-rounds").inner_text() == f"{rounds:,}"
    page.wait_for_timeout(1500)
    screenshot(page, "worker")


def test_console_shows_the_live_state_of_all_three(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    response = page.request.post(
        live_stack.url + "/api/demo/jobs",
        data={"to": "console@example.com", "mode": "fail"},
        headers={"X-CSRF-Token": token or ""},
    )
    assert response.status == 201
    expect(page.locator("#pool-size")).to_have_text("2")
    expect(page.locator("#jobs-dlq")).not_to_have_text(re.compile(r"^(-|0)$"), timeout=20_000)
    expect(page.locator("#jobs-p50")).to_have_text(re.compile(r"ms$"))
    assert page.locator("[data-unavailable]:visible").count() == 0
    screenshot(page, "console-live")


# -- the failure modes and the live figures -----------------------------------------------------


@pytest.mark.timeout(300)  # as the first test: a busy machine hashes several times slower
def test_progress_bar_appears_moves_and_reaches_the_end(page: Page, live_stack: LiveStack) -> None:
    open_worker_page(page, live_stack)
    bar = page.locator("#hash-progress")
    expect(page.locator("#run-progress")).to_be_hidden()
    rounds = rounds_for(WATCHED_RUN_S)
    page.fill("#hash-rounds", str(rounds))
    page.click("#run-pool")
    expect(page.locator("#run-progress")).to_be_visible()
    # A figure the server reported while the run was still going (not only the final 1).
    page.wait_for_function(
        "() => { const r = Number(document.getElementById('hash-progress').dataset.reported);"
        " return r > 0 && r < 1; }",
        timeout=30_000,
    )
    expect(page.locator("#progress-note")).to_have_text(re.compile(rf"of {rounds:,} rounds$"))
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=120_000)
    assert bar.evaluate("b => b.value") == 1
    expect(page.locator("#progress-note")).to_have_text(f"all {rounds:,} rounds")
    screenshot(page, "worker-progress")


def test_an_inline_run_after_a_pool_run_starts_from_an_empty_progress_panel(
    page: Page, live_stack: LiveStack
) -> None:
    open_worker_page(page, live_stack)
    bar, note = page.locator("#hash-progress"), page.locator("#progress-note")
    page.fill("#hash-rounds", "2000000")
    page.click("#run-pool")
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=60_000)
    expect(note).to_have_text("all 2,000,000 rounds")
    page.fill("#hash-rounds", "6000000")
    page.click("#run-inline")
    # At once, while the loop hashes: an empty bar, and nothing of the pool run before it.
    expect(page.locator("#result-ms")).to_have_text("running…")
    assert bar.evaluate("b => b.value") == 0
    expect(note).to_have_text(
        "no reports inline: the event loop that would answer the poll is busy hashing"
    )
    assert bar.get_attribute("data-reported") == "0"
    expect(page.locator("#run-progress")).to_have_attribute("data-mode", "inline")
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=60_000)
    assert page.locator("#result-mode").inner_text() == "inline"
    expect(note).to_have_text("all 6,000,000 rounds, known only once the loop was free again")
    assert bar.evaluate("b => b.value") == 1


def test_the_page_gives_the_rate_measured_on_this_machine(
    page: Page, live_stack: LiveStack
) -> None:
    open_worker_page(page, live_stack)
    rate = page.locator("#hash-rate")
    expect(rate).not_to_contain_text("3 million")
    page.fill("#hash-rounds", "1000000")
    page.click("#run-pool")
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=60_000)
    expect(rate).to_have_text(
        re.compile(
            r"^Measured on this machine: [\d,]+ rounds a second in the pool \(last \d runs?\)"
            r".*; so [\d,]+ rounds take about \d+\.\d s"
        )
    )


def test_the_timeout_field_is_empty_with_a_hint_not_a_value(
    page: Page, live_stack: LiveStack
) -> None:
    open_worker_page(page, live_stack)
    field = page.get_by_label("Timeout (ms, pool)", exact=True)
    expect(field).to_have_value("")
    assert field.get_attribute("placeholder") is None  # a grey number reads as a value
    expect(field).to_have_accessible_description(
        "empty for none (the route still stops any run at 60,000 ms)"
    )
    expect(page.locator("#hash-timeout-hint")).to_be_visible()


# A bar's painted box: its own, cut by every ancestor that clips (overflow other than visible).
PAINTED_BOXES = """
(selector) => [...document.querySelectorAll(selector)].map((node) => {
  let r = node.getBoundingClientRect();
  let box = { left: r.left, top: r.top, right: r.right, bottom: r.bottom };
  for (let up = node.parentElement; up; up = up.parentElement) {
    if (getComputedStyle(up).overflow === "visible") continue;
    const c = up.getBoundingClientRect();
    const left = c.left + up.clientLeft, top = c.top + up.clientTop;
    box = {
      left: Math.max(box.left, left), top: Math.max(box.top, top),
      right: Math.min(box.right, left + up.clientWidth),
      bottom: Math.min(box.bottom, top + up.clientHeight),
    };
  }
  return box;
}).filter((b) => b.right > b.left && b.bottom > b.top)
"""


def overlap(a: dict[str, float], b: dict[str, float]) -> float:
    width = min(a["right"], b["right"]) - max(a["left"], b["left"])
    height = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return max(0.0, width) * max(0.0, height)


@pytest.mark.parametrize("width", [1280, 390])
def test_heartbeat_bars_never_draw_over_the_scale_labels(
    browser: Browser, live_stack: LiveStack, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        log_in(page, live_stack.url)
        page.clock.install()
        page.goto(live_stack.url + "/demo/worker")
        expect(page.locator("#heartbeat .beat").first).to_be_visible()
        # A minute of beats at once: the strip fills, and the oldest bars (pending the longest
        # by the page's clock) stand full height at its left end, by the labels.
        page.clock.run_for(60_000)
        expect(page.locator("#heartbeat .beat.pending")).to_have_count(0, timeout=30_000)
        bars = page.evaluate(PAINTED_BOXES, "#heartbeat .beat")
        labels = page.evaluate(PAINTED_BOXES, "#heartbeat-scale .tick span")
        strip = page.locator("#heartbeat").bounding_box()
        assert strip is not None and len(labels) == 4
        # The test can fail: the bars reach the strip's left end and rise past the labels (all
        # but "10 s", perhaps: a fetch answered during the fast-forward makes its bar shorter).
        assert min(b["left"] for b in bars) <= strip["x"] + 11
        tallest = min(b["top"] for b in bars)
        assert sum(tallest < label["top"] for label in labels) >= 3, (tallest, labels)
        overlaps = [(b, label) for b in bars for label in labels if overlap(b, label) > 0]
        assert overlaps == []
        screenshot(page, f"worker-heartbeat-{width}")
    finally:
        context.close()


# Beside two busy processes the niced pool children take a share of the cores and hash many
# times slower: these bounds are hangs', not speeds.
@pytest.mark.timeout(240)
def test_a_new_run_clears_the_result_card(page: Page, live_stack: LiveStack) -> None:
    open_worker_page(page, live_stack)
    page.fill("#hash-rounds", "1000")
    page.click("#run-pool")
    expect(page.locator("#result-digest")).to_have_text(DIGEST)
    page.fill("#hash-timeout", "300")
    page.fill("#hash-rounds", "40000000")
    page.click("#run-pool")
    expect(page.locator("#result-error")).to_contain_text("worker.task_timeout")
    page.fill("#hash-timeout", "")
    page.fill("#hash-rounds", "3000000")
    page.click("#run-pool")
    # At once, before the new run answers: no digest, no time, no error from before.
    expect(page.locator("#result-digest")).to_have_text("")
    expect(page.locator("#result-ms")).to_have_text("running…")
    expect(page.locator("#result-error")).to_be_hidden()
    expect(page.locator("#result-rounds")).to_have_text("3,000,000")
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=120_000)


def test_a_timeout_shows_the_error_and_the_pool_replaces_the_process(
    page: Page, live_stack: LiveStack
) -> None:
    open_worker_page(page, live_stack)
    restarts = page.locator("#pool-restarts").inner_text()
    page.fill("#hash-timeout", "500")
    page.fill("#hash-rounds", "40000000")
    page.click("#run-pool")
    error = page.locator("#result-error")
    expect(error).to_be_visible(timeout=30_000)
    expect(error).to_contain_text("504 worker.task_timeout")
    expect(error).to_contain_text("exceeded its 500 ms timeout")
    expect(page.locator("#progress-note")).to_have_text("stopped: worker.task_timeout")
    expect(page.locator("#result-digest")).to_have_text("")
    expect(page.locator("#pool-size")).to_have_text("2", timeout=20_000)
    assert page.locator("#pool-restarts").inner_text() == restarts  # a deliberate kill is free
    screenshot(page, "worker-timeout")


def test_killing_a_child_counts_a_restart(page: Page, live_stack: LiveStack) -> None:
    open_worker_page(page, live_stack)
    before = int(page.locator("#pool-restarts").inner_text())
    assert before < int(page.locator("#pool-max-restarts").inner_text())
    page.click("#kill-child")
    expect(page.locator("#kill-result")).to_have_text(re.compile(r"^Killed child \d+ \(SIGKILL\)"))
    killed = re.search(r"\d+", page.locator("#kill-result").inner_text())
    assert killed is not None
    expect(page.locator("#pool-restarts")).to_have_text(str(before + 1), timeout=20_000)
    expect(page.locator("#pool-size")).to_have_text("2", timeout=20_000)
    # The dip in processes is over in a fraction of a second; the pool log keeps it, newest first.
    expect(page.locator("#pool-log li").first).to_have_text(
        re.compile(rf"^\d\d:\d\d:\d\d child {killed[0]} killed, replaced by \d+ in \d+\.\d s$")
    )
    expect(page.locator("#pool-log-empty")).to_be_hidden()
    screenshot(page, "worker-kill")


@pytest.mark.timeout(240)  # the burst drains many times slower beside busy processes
def test_a_burst_shows_runs_refused_with_429(page: Page, live_stack: LiveStack) -> None:
    open_worker_page(page, live_stack)
    page.click("#burst")
    result = page.locator("#burst-result")
    expect(result).to_contain_text("refused with 429 worker.overloaded", timeout=30_000)
    expect(result).to_have_text(
        re.compile(r"^14 runs sent at once to a pool that holds 10: 10 ran, 4 refused")
    )
    assert result.get_attribute("data-probe") == "429"
    expect(result).to_contain_text(
        re.compile(
            r"This page's own run, sent just after: 429 worker\.overloaded, Retry-After: \d+ s"
        )
    )
    screenshot(page, "worker-burst")
    expect(page.locator("#pool-queued")).to_have_text("0", timeout=150_000)


@pytest.mark.timeout(300)  # up to three inline runs of several seconds each, on a busy machine
def test_the_heartbeat_has_a_scale_a_run_max_and_grows_while_a_beat_is_pending(
    page: Page, live_stack: LiveStack
) -> None:
    open_worker_page(page, live_stack)
    expect(page.locator("#heartbeat-scale .tick")).to_have_count(4)
    expect(page.locator("#heartbeat")).to_have_attribute(
        "aria-label", re.compile(r"last beat \d+ ms")
    )
    # The inline cap: a stall of over two seconds on any machine, so that a beat sent a second
    # into it (the beats go once a second) is still pending a second later.
    page.fill("#hash-rounds", "8000000")
    # While the loop hashes, a pending bar grows past a second, before its answer arrives. On a
    # loaded machine the browser's own once-a-second beat can be late for the whole stall (one
    # CI run in many saw no pending beat): then the run is made again, up to three times. The
    # server refuses an inline run (429 rate_limited) for as long as the last one took, so a
    # run made again waits for that gate to open.
    stalled_or_refused = (
        "() => [...document.querySelectorAll('#heartbeat .beat.pending')]"
        ".some(b => b.classList.contains('stalled'))"
        " || !document.getElementById('result-error').hidden"
    )
    runs = 0
    deadline = time.monotonic() + 240
    while runs < 3 and time.monotonic() < deadline:
        page.click("#run-inline")
        try:
            page.wait_for_function(stalled_or_refused, timeout=30_000)
        except PlaywrightTimeoutError:
            runs += 1  # it ran, and no beat was seen pending past a second
            expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=60_000)
            continue
        error = page.locator("#result-error")
        if error.is_hidden():
            break  # a beat pending past a second, the run still going
        assert "429 rate_limited" in error.inner_text(), error.inner_text()
        expect(page.locator("#run-inline")).to_be_enabled()
        page.wait_for_timeout(500)  # the gate is open again after as long as the last run took
    else:
        pytest.fail(f"{runs} inline runs and never a beat pending past a second")
    expect(page.locator("#beat-last")).to_have_text(re.compile(r"^waiting [\d,]+ ms$"))
    screenshot(page, "worker-stalled")  # the pending bar, mid-stall
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=60_000)
    assert page.locator("#result-mode").inner_text() == "inline"
    max_text = page.locator("#beat-max").inner_text()
    assert int(max_text.removesuffix(" ms").replace(",", "")) >= 1000, max_text
    expect(page.locator("#heartbeat")).to_have_attribute(
        "aria-label", re.compile(r"slowest during the last run [\d,]+ ms")
    )


def test_at_390_px_the_heartbeat_sits_by_the_run_buttons_without_sideways_scroll(
    browser: Browser, live_stack: LiveStack
) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    try:
        open_worker_page(page, live_stack)
        # The form's first field at the top of the screen, as a thumb leaves it to type:
        # the run buttons and the whole heartbeat strip are on screen together.
        page.locator("#hash-input").evaluate("e => e.scrollIntoView({block: 'start'})")
        expect(page.locator("#run-pool")).to_be_in_viewport(ratio=1)
        expect(page.locator("#run-inline")).to_be_in_viewport(ratio=1)
        expect(page.locator("#heartbeat")).to_be_in_viewport(ratio=1)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        screenshot(page, "worker-390")
    finally:
        context.close()


def test_bad_fields_are_worded_at_their_field_and_gone_once_corrected(
    page: Page, live_stack: LiveStack
) -> None:
    open_worker_page(page, live_stack)
    page.fill("#hash-rounds", "0")
    page.fill("#hash-timeout", "soon")
    page.click("#run-pool")
    expect_field_error(page, "#hash-rounds", ROUNDS)
    expect_field_error(page, "#hash-timeout", TIMEOUT)
    expect(page.locator("#result-card")).to_be_hidden()  # nothing ran
    page.fill("#hash-timeout", "")
    page.fill("#hash-rounds", "9000000")
    page.click("#run-inline")  # the inline cap, at the rounds it caps (no "body:" before it)
    expect_field_error(page, "#hash-rounds", INLINE_CAP)
    expect_no_field_error(page, "#hash-timeout")
    page.fill("#hash-rounds", "1000")  # editing clears the message at once
    expect_no_field_error(page, "#hash-rounds")
    page.click("#run-pool")
    expect(page.locator("#result-digest")).to_have_text(DIGEST, timeout=30_000)
    expect_no_field_error(page, "#hash-rounds")  # and it stays gone after the next submit
