"""/demo/worker in the browser: the heartbeat keeps beating while the pool hashes."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import LiveStack, log_in, screenshot

pytestmark = pytest.mark.e2e


def test_pool_hash_keeps_the_heartbeat_going(page, live_stack: LiveStack) -> None:
    log_in(page, live_stack.url)
    page.goto(live_stack.url + "/demo/worker")
    expect(page.locator("#heartbeat .beat").first).to_be_visible()
    page.fill("#hash-rounds", "9000000")  # ~3 s here
    page.click("#run-pool")
    expect(page.locator("#result-mode")).to_have_text("pool", timeout=60_000)
    beats = int(page.locator("#beats-during").get_attribute("data-final") or "0")
    assert beats > 1, "heartbeats must keep arriving while the pool hashes"
    assert len(page.locator("#result-digest").inner_text()) == 64
    assert page.locator("#result-rounds").inner_text() == "9,000,000"
    page.wait_for_timeout(1500)
    screenshot(page, "worker")


def test_console_shows_the_live_state_of_all_three(page, live_stack: LiveStack) -> None:
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
