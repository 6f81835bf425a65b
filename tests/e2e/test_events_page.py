"""/demo/events in the browser: a signup shows its event pending, then published with each
listener group's status; a rollback shows nothing new; a paused relay lets rows pile up; a
focused Requeue button keeps its focus through live refreshes; long addresses fit 390 px and
listener names break no word there."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, Response, expect

from app.events.listeners import LISTENERS
from tests.e2e.conftest import ONE_BUS, LiveStack, log_in, screenshot
from tests.e2e.fields import EMAIL, expect_field_error, expect_no_field_error
from tests.e2e.geometry import broken_words

pytestmark = pytest.mark.e2e

GROUPS = [listener.group for listener in LISTENERS]  # in the order the page lists them


def sign_up(page: Page, email: str, mode: str = "ok") -> str:
    page.fill("#signup-email", email)
    page.select_option("#signup-mode", mode)
    before = page.locator("#signup-result").inner_text()
    page.click("#signup")
    # The answer to this click, not the previous one still on the page.
    expect(page.locator("#signup-result")).not_to_have_text(before)
    expect(page.locator("#signup-result")).not_to_be_empty()
    return str(page.locator("#signup-result").inner_text())


def test_signup_event_flows_to_every_listener_and_the_relay_pauses(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/events")
    assert "Committed" in sign_up(page, "grace@example.com")
    card = page.locator("#events article.job").first
    expect(card).to_have_attribute("data-status", "published", timeout=20_000)
    for group in GROUPS:
        expect(card.locator(f'li[data-group="{group}"] .badge')).to_have_text(
            "done", timeout=20_000
        )
    # The signup's own job (outbox.enqueue), linked to its page in the admin.
    own = card.locator('li[data-key="job"]')
    expect(own.locator(".badge")).to_have_text("done", timeout=20_000)
    expect(own.locator("a")).to_have_attribute("href", re.compile(r"^/admin/jobs/a\w{11}\?job="))

    shown = page.locator("#events article.job").count()  # other tests share the stack
    assert "Rolled back" in sign_up(page, "nobody@example.com", "rollback")
    page.wait_for_timeout(1500)  # a poll or two: nothing new appears
    expect(page.locator("#events article.job")).to_have_count(shown)
    expect(page.locator("#events article.job", has_text="nobody@example.com")).to_have_count(0)

    page.click("#relay-toggle")  # pause
    expect(page.locator("#relay-state")).to_have_text("relay paused")
    sign_up(page, "piled.up@example.com")
    sign_up(page, "also.piled@example.com")
    # Two rows each: the signup's event and its own job.
    expect(page.locator("#outbox-pending")).to_have_text("4", timeout=10_000)
    piled = page.locator("#events article.job").first
    expect(piled).to_have_attribute("data-status", "pending")
    # Nothing is published yet: every group waits for the relay, none has it queued; nor is
    # the job enqueued.
    expect(piled.locator("li .badge")).to_have_text(["waiting for the relay"] * (len(GROUPS) + 1))
    screenshot(page, "events-paused")
    page.click("#relay-toggle")  # resume: the rows drain
    expect(page.locator("#outbox-pending")).to_have_text("0", timeout=20_000)
    expect(page.locator('#events article.job[data-status="pending"]')).to_have_count(0)
    expect(piled.locator("li .badge")).to_have_text(["done"] * (len(GROUPS) + 1), timeout=20_000)

    assert "Committed" in sign_up(page, "fail.crm@example.com")
    dead = page.locator("#dlq-items li").first
    expect(dead).to_contain_text("CrmRejected", timeout=30_000)
    screenshot(page, "events")


@ONE_BUS
def test_a_bad_address_shows_the_field_error(page: Page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/events")
    for typed in ("not an address", "Ada, L <ada@example.com>"):  # not email-validator's words
        page.fill("#signup-email", typed)
        page.click("#signup")
        expect_field_error(page, "#signup-email", EMAIL)
        expect(page.locator("#signup-result")).to_have_text("")
    assert "Committed" in sign_up(page, "ada@example.com")
    expect_no_field_error(page, "#signup-email")


def is_state_poll(response: Response) -> bool:
    return response.url.endswith("/api/demo/events") and response.request.method == "GET"


def test_a_focused_requeue_button_keeps_its_focus_through_refreshes(
    page: Page, live_stack: LiveStack
) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/events")
    sign_up(page, "fail.focus@example.com")
    item = page.locator("#dlq-items li", has_text="fail.focus@example.com")
    expect(item).to_have_count(1, timeout=30_000)
    item.locator("button").focus()
    page.evaluate("() => { window.focusedBefore = document.activeElement; }")
    assert page.evaluate("() => document.activeElement.textContent") == "Requeue"
    # Something changes meanwhile: a new event lands at the top of the list being patched.
    page.evaluate(
        """() => fetch("/api/demo/events/signup", {method: "POST",
             headers: {"Content-Type": "application/json",
                       "X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content},
             body: JSON.stringify({email: "meanwhile@example.com", mode: "ok"})})"""
    )
    for _ in range(2):
        with page.expect_response(is_state_poll, timeout=10_000):
            pass
    expect(page.locator("#events article.job").first).to_contain_text("meanwhile@example.com")
    assert page.evaluate("() => document.activeElement === window.focusedBefore")
    assert page.evaluate("() => document.activeElement.isConnected")


@ONE_BUS
def test_long_addresses_fit_a_390_px_screen(page: Page, live_stack: LiveStack) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/events")
    local = "fail" + "x" * 116  # 120 characters before the @, and a dead letter too
    long_domain = ".".join(c * 40 for c in "abc") + ".example.com"
    assert "Committed" in sign_up(page, f"{local}@example.com")
    assert "Committed" in sign_up(page, f"n{'o' * 60}@{long_domain}")
    expect(page.locator("#dlq-items li", has_text=local)).to_have_count(1, timeout=30_000)
    expect(page.locator("#events article.job", has_text=long_domain)).to_have_count(1)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    # Listener names (one long CamelCase word each) stay whole, in the events and the groups.
    expect(page.locator("#groups tbody tr")).to_have_count(len(GROUPS))
    assert broken_words(page, "#events li, #groups td, #groups th, #dlq-items .mono") == []
    # The one zone, labelled once, and the times in it.
    assert "Times on this page are in UTC" in page.locator(".page-head").inner_text()
    screenshot(page, "events-390")
