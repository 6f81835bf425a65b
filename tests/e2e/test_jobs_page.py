"""/demo/jobs in the browser: a flaky job shows its two attempts and "done"; a failing job
lands in the DLQ and can be requeued."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import LiveStack, log_in, screenshot

pytestmark = pytest.mark.e2e


def enqueue(page, mode: str) -> str:  # type: ignore[no-untyped-def]
    page.fill("#job-to", f"{mode}@example.com")
    page.select_option("#job-mode", mode)
    before = page.locator("#enqueue-result").inner_text()
    page.click("#enqueue")
    # The answer to this click, not the previous one still on the page.
    expect(page.locator("#enqueue-result")).not_to_have_text(before)
    expect(page.locator("#enqueue-result")).to_contain_text("Enqueued")
    return page.locator("#enqueue-result").inner_text().split()[1].rstrip(".")


def test_flaky_job_retries_then_done_and_fail_job_lands_in_dlq(page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    flaky = enqueue(page, "flaky")
    card = page.locator(f'article.job[data-id="{flaky}"]')
    expect(card).to_have_attribute("data-status", "done", timeout=20_000)
    assert card.locator(".event-start").count() == 2
    assert card.locator(".event-retry").count() == 1
    assert "attempt 2 succeeded" in card.locator(".event-done").inner_text()

    failing = enqueue(page, "fail")
    card = page.locator(f'article.job[data-id="{failing}"]')
    expect(card).to_have_attribute("data-status", "dlq", timeout=30_000)
    assert card.locator(".event-start").count() == 3
    dead = page.locator(f'#dlq-items li[data-id="{failing}"]')
    expect(dead).to_be_visible()
    assert "SimulatedSendError" in dead.inner_text()
    screenshot(page, "jobs")

    dead.get_by_role("button", name="Requeue").click()
    expect(card).to_have_attribute("data-status", "dlq", timeout=30_000)
    expect(card.locator(".event-requeued")).to_have_count(1)


def test_empty_recipient_shows_the_field_error(page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/jobs")
    page.fill("#job-to", "")
    page.click("#enqueue")
    expect(page.locator("#error-to")).not_to_be_empty()
