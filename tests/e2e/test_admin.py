"""The admin pages (mega.web.admin, mounted at /admin by the sample) in the browser: the
overview, a dead-lettered job's page and the DLQ browser at 1280 and 390 px, with no sideways
scroll and no word broken mid-word; Retry from the browser; Pause and Resume of a schedule.
Screenshots go to artifacts/screenshots (admin-*.png)."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import LiveStack, log_in, screenshot
from tests.e2e.geometry import broken_words

pytestmark = pytest.mark.e2e


def _post(page: Page, url: str, body: dict[str, object]) -> dict[str, object]:
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    assert token is not None
    response = page.request.post(url, data=body, headers={"X-CSRF-Token": token})
    assert response.ok, response.text()
    data: dict[str, object] = response.json()["data"]
    return data


def _dead_letter(page: Page, url: str) -> str:
    """A job of the sample that ends in the DLQ (three attempts, with backoff); its id."""
    job = _post(page, url + "/api/demo/jobs", {"to": "ada@example.com", "mode": "permanent"})
    job_id = str(job["id"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page.goto(url + f"/admin/jobs/{job_id}")
        if page.locator("#job-state").inner_text() == "dlq":
            return job_id
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached the DLQ")


def _fits(page: Page, width: int) -> None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{page.url} is {scroll} px wide at {width}"
    assert broken_words(page, "main") == []


@pytest.mark.parametrize("live_stack", ["nats"], indirect=True)
def test_the_admin_pages_at_1280_and_390_px(browser: Browser, live_stack: LiveStack) -> None:
    url = live_stack.url
    for width, height in ((1280, 860), (390, 844)):
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.set_default_timeout(15_000)
        log_in(page, url)
        expect(page.locator("#admin-link")).to_have_attribute("href", "/admin/")
        job_id = _dead_letter(page, url)

        page.goto(url + "/admin/")
        row = page.locator('#job-queues tr[data-lane="EmailJob"]')
        expect(row).to_be_visible()
        expect(page.locator('#listener-groups tr[data-lane="CrmSyncListener"]')).to_be_visible()
        expect(page.locator('[data-schedule="CronCounterSchedule"]')).to_be_visible()
        _fits(page, width)
        screenshot(page, f"admin-overview-{width}")

        page.goto(url + f"/admin/jobs/{job_id}")
        expect(page.locator("#job-id")).to_have_text(job_id)
        expect(page.locator("#attempts tbody tr")).to_have_count(1)
        _fits(page, width)
        screenshot(page, f"admin-job-{width}")

        page.goto(url + "/admin/dlq/EmailJob")
        card = page.locator(f'#dlq-records li[data-id="{job_id}"]')
        expect(card).to_be_visible()
        expect(card).to_contain_text("Permanent")
        card.locator("summary").click()
        expect(card.locator("pre")).to_contain_text('"to": "ada@example.com"')
        _fits(page, width)
        screenshot(page, f"admin-dlq-{width}")
        context.close()


@pytest.mark.parametrize("live_stack", ["nats"], indirect=True)
def test_retry_from_the_dlq_and_pause_resume_a_schedule(page: Page, live_stack: LiveStack) -> None:
    url = live_stack.url
    log_in(page, url)
    job_id = _dead_letter(page, url)
    page.goto(url + "/admin/dlq/EmailJob")
    card = page.locator(f'#dlq-records li[data-id="{job_id}"]')
    first_seq = card.get_attribute("data-seq")
    card.get_by_role("button", name="Retry").click()
    expect(page.locator(".adm-flash")).to_have_text(
        f"Dead letter {job_id} requeued: it runs again, attempts counted from 1."
    )
    # The sample's `permanent` job fails every time: it ran again and is a new dead letter.
    deadline = time.monotonic() + 30
    while card.count() == 0 or card.get_attribute("data-seq") == first_seq:
        assert time.monotonic() < deadline, "the retried job never ran again"
        time.sleep(0.3)
        page.reload()
    expect(page.locator(f'#dlq-records li[data-id="{job_id}"]')).to_have_count(1)

    page.goto(url + "/admin/")
    schedule = page.locator('[data-schedule="CronCounterSchedule"]')
    schedule.get_by_role("button", name="Pause").click()
    expect(page.locator(".adm-flash")).to_contain_text("CronCounterSchedule: Paused by demo")
    expect(schedule.locator(".adm-badge").first).to_have_text("paused")
    schedule.get_by_role("button", name="Resume").click()
    expect(page.locator(".adm-flash")).to_contain_text("resumed by demo")
    expect(schedule.locator(".adm-badge").first).to_have_text("ticking")
    assert re.search(r"/admin/#schedules$", page.url)
