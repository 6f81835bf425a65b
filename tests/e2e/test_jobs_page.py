"""/demo/jobs in the browser: a flaky job shows its two attempts, "done" and its result; a slow
job cancelled mid-run ends "cancelled" and is never retried; a permanent job is dead-lettered
after one attempt; a failing job
lands in the DLQ and can be requeued, and its focused Requeue button stays focused across live
refreshes; a slow job draws its progress; a 200-character recipient fits 390 px; bad input gets
plain sentences at its fields, gone once corrected; a count of 20 enqueues 20 jobs."""

from __future__ import annotations

import re
import time
from typing import Literal

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page, expect

from tests.e2e.conftest import ONE_BUS, SCREENSHOTS, LiveStack, log_in, screenshot
from tests.e2e.fields import COUNT, DELAY, EMAIL, expect_field_error, expect_no_field_error

pytestmark = pytest.mark.e2e
# Where a panel is checked: in light at a desktop's width, in dark at a phone's.
VIEWS: list[tuple[Literal["light", "dark"], int]] = [("light", 1280), ("dark", 390)]


def enqueue(page: Page, mode: str, to: str | None = None) -> str:
    page.fill("#job-to", to or f"{mode}@example.com")
    page.select_option("#job-mode", mode)
    before = page.locator("#enqueue-result").inner_text()
    page.click("#enqueue")
    # The answer to this click, not the previous one still on the page.
    expect(page.locator("#enqueue-result")).not_to_have_text(before)
    expect(page.locator("#enqueue-result")).to_contain_text("Enqueued")
    return page.locator("#enqueue-result").inner_text().split()[1].rstrip(".")


def check_panel(page: Page, panel: str, scheme: str, width: int) -> None:
    """Axe finds nothing serious on the page; the panel's screenshots (the page at it, and the
    panel alone) are taken; nothing of it reaches past `width`."""
    violations = [
        f"{v['id']}: {v['help']}"
        for v in Axe().run(page).response["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert not violations, violations
    page.locator(f"#{panel}").scroll_into_view_if_needed()
    screenshot(page, f"jobs-{panel}-{scheme}-{width}")
    page.locator(f"#{panel}").screenshot(path=str(SCREENSHOTS / f"{panel}-{scheme}-{width}.png"))
    wide = page.evaluate(
        f"[...document.querySelectorAll('#{panel} *')].filter(e => e.getBoundingClientRect()"
        f".right > {width}).map(e => e.tagName + '#' + e.id + '.' + e.className)"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= width, wide


def test_flaky_job_retries_then_done_and_fail_job_lands_in_dlq(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    flaky = enqueue(page, "flaky")
    card = page.locator(f'article.job[data-id="{flaky}"]')
    expect(card).to_have_attribute("data-status", "done", timeout=20_000)
    expect(card.locator(".event-retry")).to_have_count(1)
    expect(card.locator(".event-retry")).to_contain_text("attempt 1 on worker ")
    expect(card.locator(".event-retry")).to_contain_text("failed: SimulatedSendError")
    expect(card.locator(".event-done")).to_contain_text("attempt 2 on worker ")
    expect(card.locator(".job-result")).to_have_text(
        "Result sent_to: flaky@example.com, attempt: 2"
    )

    failing = enqueue(page, "fail")
    card = page.locator(f'article.job[data-id="{failing}"]')
    expect(card).to_have_attribute("data-status", "dlq", timeout=30_000)
    expect(card.locator(".event-retry")).to_have_count(2)
    expect(card.locator(".event-fail")).to_have_count(1)
    expect(card.locator(".event-dlq")).to_have_text(
        re.compile("moved to the dead-letter queue after 3 attempts$")
    )
    dead = page.locator(f'#dlq-items li[data-id="{failing}"]')
    expect(dead).to_be_visible()
    assert "SimulatedSendError" in dead.inner_text()
    screenshot(page, "jobs")

    dead.get_by_role("button", name="Requeue").click()
    expect(card).to_have_attribute("data-status", "dlq", timeout=30_000)
    expect(
        card.locator(".event", has_text="requeued from the DLQ: attempts count from 1")
    ).to_have_count(1)
    # Its three runs before the requeue are kept above that line, the last one's to the DLQ.
    expect(card.locator(".event", has_text="; to the DLQ")).to_have_count(1)


def test_a_permanent_job_lands_in_the_dlq_after_one_attempt(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    page.select_option("#job-mode", "permanent")
    expect(page.locator("#mode-help")).to_have_text(
        "permanent: raises Permanent: one attempt, then the DLQ"
    )
    job = enqueue(page, "permanent")
    card = page.locator(f'article.job[data-id="{job}"]')
    expect(card).to_have_attribute("data-status", "dlq", timeout=20_000)
    dead = page.locator(f'#dlq-items li[data-id="{job}"]')
    expect(dead).to_contain_text("to permanent@example.com, 1 attempt")
    expect(dead).to_contain_text("Permanent: no mailbox permanent@example.com")
    status = page.request.get(f"{live_stack.url}/api/demo/jobs/{job}").json()["data"]
    assert (status["state"], status["attempts"]) == ("dlq", 1)


@ONE_BUS
def test_empty_recipient_shows_the_field_error(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    page.fill("#job-to", "")
    page.click("#enqueue")
    expect(page.locator("#error-to")).not_to_be_empty()


def refreshes(page: Page) -> int:
    """How many times the page has fetched and patched its state so far."""
    return int(page.locator("#jobs-page").get_attribute("data-loads") or 0)


@ONE_BUS
def test_a_focused_requeue_button_keeps_focus_across_refreshes(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    failing = enqueue(page, "fail")
    button = page.locator(f'#dlq-items li[data-id="{failing}"] button')
    expect(button).to_be_visible(timeout=30_000)
    button.focus()
    focused = button.element_handle()
    seen = refreshes(page)
    page.wait_for_function(
        "n => Number(document.getElementById('jobs-page').dataset.loads) >= n",
        arg=seen + 3,
        timeout=15_000,
    )
    assert page.evaluate("node => document.activeElement === node", focused)
    assert page.evaluate("() => document.activeElement.closest('li').dataset.id") == failing


def test_a_slow_job_draws_its_progress_on_one_attempt(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    slow = enqueue(page, "slow")
    card = page.locator(f'article.job[data-id="{slow}"]')
    bar = card.get_by_role("progressbar", name=f"Progress of job {slow}")
    expect(bar).to_be_visible(timeout=15_000)
    expect(card.locator(".job-progress")).to_contain_text("2 of 6 steps done", timeout=15_000)
    assert 0 < float(bar.get_attribute("value") or 0) < 1
    running = card.locator(".event-running")
    expect(running).to_have_count(1)
    expect(running).to_contain_text("attempt 1 on worker ")
    screenshot(page, "jobs-progress")
    for scheme in ("light", "dark"):  # the bar and its note, as axe-core sees them
        page.emulate_media(color_scheme=scheme)
        violations = [
            f"{v['id']}: {v['help']} -> {[node['target'] for node in v['nodes'][:4]]}"
            for v in Axe().run(page).response["violations"]
            if v["impact"] in ("serious", "critical")
        ]
        assert not violations, (scheme, violations)


def test_a_slow_job_cancelled_mid_run_ends_cancelled_and_is_never_retried(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    slow = enqueue(page, "slow")
    card = page.locator(f'article.job[data-id="{slow}"]')
    expect(card).to_have_attribute("data-status", "running", timeout=15_000)
    expect(card.locator(".job-progress")).to_contain_text("1 of 6 steps done", timeout=15_000)
    card.get_by_role("button", name=f"Cancel job {slow}").click()
    expect(page.locator("#jobs-notice")).to_have_text(
        f"Job {slow} cancelled: it will not run again."
    )
    expect(card).to_have_attribute("data-status", "cancelled")
    expect(card.get_by_role("button", name=f"Cancel job {slow}")).to_have_count(0)
    expect(card.locator(".event-cancelled").last).to_have_text(
        re.compile("cancelled during attempt 1: never retried$")
    )
    screenshot(page, "jobs-cancelled")
    # Past its ack wait and the backoff's longest wait, it is still cancelled on one attempt.
    url = f"{live_stack.url}/api/demo/jobs/{slow}"
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        job = page.request.get(url).json()["data"]
        assert (job["state"], job["attempts"]) == ("cancelled", 1), job
        page.wait_for_timeout(500)
    assert card.get_attribute("data-status") == "cancelled"


@ONE_BUS
def test_a_long_recipient_does_not_widen_a_phone_screen(page: Page, live_stack: LiveStack) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    # 200 characters, every part at its longest: a 64-character local part, 63-character labels.
    long_to = "x" * 64 + "@" + "d" * 63 + "." + "e" * 63 + ".exa.com"
    assert len(long_to) == 200
    job = enqueue(page, "fail", to=long_to)
    card = page.locator(f'article.job[data-id="{job}"]')
    expect(card).to_have_attribute("data-status", "dlq", timeout=30_000)
    expect(page.locator(f'#dlq-items li[data-id="{job}"]')).to_contain_text(long_to)
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width} px wide"
    screenshot(page, "jobs-390")


def job_ids(page: Page, live_stack: LiveStack) -> list[str]:
    """The ids GET /api/demo/jobs lists now (the page's own session asks)."""
    jobs = page.request.get(live_stack.url + "/api/demo/jobs").json()["data"]["jobs"]
    return [job["id"] for job in jobs]


@ONE_BUS
def test_bad_input_gets_plain_sentences(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    before = job_ids(page, live_stack)
    page.fill("#job-to", "not-an-address")
    page.fill("#job-delay", "abc")  # a type=number box would have handed over "", sent as 0
    page.fill("#job-count", "0")
    # A mode the select does not offer, as a hand-made request would send it.
    page.evaluate("() => document.getElementById('job-mode').add(new Option('x', 'sometimes'))")
    page.select_option("#job-mode", "sometimes")
    page.click("#enqueue")
    expect_field_error(page, "#job-delay", DELAY)
    expect_field_error(page, "#job-to", EMAIL)
    expect_field_error(page, "#job-count", COUNT)
    expect(page.locator("#job-mode + .field-error")).to_contain_text("must be one of")
    expect(page.locator("#enqueue-result")).to_have_text("")  # every sentence is at its field
    assert job_ids(page, live_stack) == before  # nothing was enqueued

    page.fill("#job-to", "fixed@example.com")  # editing a field clears its own message
    expect_no_field_error(page, "#job-to")
    expect_field_error(page, "#job-delay", DELAY)
    page.fill("#job-delay", "-5")
    page.select_option("#job-mode", "ok")
    page.click("#enqueue")  # the next submit clears every message before the answer
    expect_field_error(page, "#job-delay", DELAY)
    expect_no_field_error(page, "#job-mode")
    expect_no_field_error(page, "#job-to")
    page.fill("#job-delay", "0")
    page.fill("#job-count", "1")
    page.click("#enqueue")
    expect(page.locator("#enqueue-result")).to_contain_text("Enqueued")
    for field in ("#job-to", "#job-mode", "#job-delay", "#job-count"):
        expect_no_field_error(page, field)


def test_a_count_of_20_enqueues_20_jobs(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    to = "twenty@example.com"
    page.fill("#job-to", to)
    page.select_option("#job-mode", "ok")
    page.fill("#job-count", "20")
    page.click("#enqueue")
    expect(page.locator("#enqueue-result")).to_contain_text("Enqueued 20 jobs")
    # The page shows the newest ten, the other ten are a page older; the API lists all 20.
    cards = page.locator("#jobs article.job", has=page.locator(".job-to", has_text=to))
    expect(cards).to_have_count(10)
    expect(page.locator("#jobs-older")).to_be_visible()
    listed = page.request.get(live_stack.url + "/api/demo/jobs").json()["data"]["jobs"]
    assert sum(job["to"] == to for job in listed) == 20


# Room the closed select keeps for its arrow, beside the padding (Chromium draws about 20 px).
SELECT_ARROW_PX = 24


@ONE_BUS
def test_the_mode_select_shows_each_option_whole_on_a_phone(
    page: Page, live_stack: LiveStack
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    select = page.locator("#job-mode")
    box = select.bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    # Each option's text in the select's own font, against the room inside its box.
    fit = page.evaluate(
        """arrow => {
            const select = document.getElementById("job-mode");
            const style = getComputedStyle(select);
            const probe = document.createElement("span");
            probe.style.cssText = "position:absolute;visibility:hidden;white-space:pre";
            probe.style.font = style.font;
            document.body.append(probe);
            const texts = [...select.options].map((option) => {
                probe.textContent = option.text;
                return [option.text, probe.getBoundingClientRect().width];
            });
            probe.remove();
            const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
            return { room: select.clientWidth - padding - arrow, texts };
        }""",
        SELECT_ARROW_PX,
    )
    cut = [(text, round(width)) for text, width in fit["texts"] if width > fit["room"]]
    assert not cut, f"cut at {round(fit['room'])} px: {cut}"
    # The chosen mode's explanation sits below the select, whole, and follows the choice.
    page.select_option("#job-mode", "crash")
    expect(page.locator("#mode-help")).to_have_text(
        "crash: kills its worker on every attempt, then the DLQ"
    )
    help_box = page.locator("#mode-help").bounding_box()
    assert help_box and help_box["x"] + help_box["width"] <= 390, help_box
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    screenshot(page, "jobs-mode-390")


def test_the_page_shows_the_newest_ten_and_links_to_older_ones(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    ids = [enqueue(page, "ok") for _ in range(12)][::-1]  # newest first
    cards = page.locator("#jobs article.job")
    expect(cards).to_have_count(10)
    # Read in one go, once a refresh has shown the newest (card by card, a refresh in between
    # would shift the list under the reads).
    page.wait_for_function(
        """want => JSON.stringify([...document.querySelectorAll("#jobs article.job")]
            .map((card) => card.dataset.id)) === JSON.stringify(want)""",
        arg=ids[:10],
    )
    older = page.locator("#jobs-older")
    expect(older).to_have_attribute("href", f"/demo/jobs?before={ids[9]}#timeline")
    older.click()
    page.wait_for_url(f"**/demo/jobs?before={ids[9]}#timeline")
    expect(cards.first).to_have_attribute("data-id", ids[10])
    assert cards.nth(1).get_attribute("data-id") == ids[11]
    assert cards.count() <= 10
    # Live refreshes keep this older page (they ask for it), not the newest one.
    seen = refreshes(page)
    page.wait_for_function(
        "n => Number(document.getElementById('jobs-page').dataset.loads) >= n", arg=seen + 2
    )
    expect(cards.first).to_have_attribute("data-id", ids[10])
    expect(page.locator("#jobs-newest")).to_be_visible()
    screenshot(page, "jobs-older")
    page.locator("#jobs-newest").click()
    expect(cards.first).to_have_attribute("data-id", ids[0])


def check_panel_in_each_view(page: Page, panel: str) -> None:
    """`check_panel` in light at 1280 px, then in dark at 390 px, on the page as it is."""
    for scheme, width in VIEWS:
        page.emulate_media(color_scheme=scheme)
        page.set_viewport_size({"width": width, "height": 900})
        check_panel(page, panel, scheme, width)


def test_the_noisy_neighbour_panel_draws_each_tenants_wait(
    page: Page, live_stack: LiveStack
) -> None:
    """Flood in order, then fair: the table shows both tenants, every job started, and small's
    p99 wait fair is far below its wait in order; axe finds nothing serious, in light at 1280 px
    and in dark at 390 px, where the page still fits."""
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    expect(page.locator("#noisy-empty")).to_be_visible()
    waits = {}
    for mode in ("in_order", "fair"):
        page.click(f'[data-noisy-mode="{mode}"]')
        expect(page.locator("#noisy-status")).to_contain_text("enqueued")
        run = page.locator("#noisy-status").inner_text().split()[1]
        expect(page.locator("#noisy")).to_have_attribute("data-done", run, timeout=30_000)
        rows = page.locator("#noisy-rows tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0).locator("td").nth(0)).to_have_text("500 of 500")
        expect(rows.nth(1).locator("td").nth(0)).to_have_text("5 of 5")
        waits[mode] = int(rows.nth(1).locator("td").nth(2).inner_text().split()[0].replace(",", ""))
    # Fair takes the small tenant's jobs in turn: its p99 wait is a fraction of in order's (4x
    # on a quiet machine, 2.9x beside two busy loops); the turns themselves are the fair lane
    # tests' (every driver), this is the panel drawing them.
    assert waits["fair"] * 2 < waits["in_order"], waits
    expect(page.locator("#noisy-empty")).to_be_hidden()
    expect(page.locator("#noisy-starts")).to_contain_text("Starts in each second: ")
    check_panel_in_each_view(page, "noisy")


def test_the_pipeline_panel_draws_a_group_and_its_callback_run_once(
    page: Page, live_stack: LiveStack
) -> None:
    """Run the pipeline with the middle size failing: five member boxes end four done and one
    dlq, the callback ran once, and the table lists the five outcomes it received with the
    failure's error. A size out of range gets its sentence at the field. Axe finds nothing
    serious, in light at 1280 px and in dark at 390 px, where the panel still fits."""
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    expect(page.locator("#pipeline-empty")).to_be_visible()
    page.fill("#pipeline-members", "9")
    page.click("#pipeline-run")
    expect(page.locator("#error-members")).to_contain_text("8")
    page.fill("#pipeline-members", "5")
    page.check("#pipeline-fail")
    page.click("#pipeline-run")
    expect(page.locator("#pipeline-status")).to_contain_text("enqueued")
    run = page.locator("#pipeline-status").inner_text().split()[1]
    expect(page.locator("#pipeline")).to_have_attribute("data-done", run, timeout=30_000)
    steps = page.locator("#pipeline-steps li")
    expect(steps).to_have_count(5)
    states = [steps.nth(n).get_attribute("data-state") for n in range(5)]
    assert states == ["done", "done", "dlq", "done", "done"], states
    expect(page.locator("#pipeline-runs")).to_have_text("ran once")
    rows = page.locator("#pipeline-received tr")
    expect(rows).to_have_count(5)
    expect(rows.nth(2)).to_contain_text("Permanent: cannot resize")
    expect(rows.nth(0)).to_contain_text(f"/photos/{run}/64.webp")
    expect(page.locator("#pipeline-status")).to_have_text(f"Workflow {run} is done.")
    check_panel_in_each_view(page, "pipeline")
