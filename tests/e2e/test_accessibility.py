"""Every page, checked by axe-core (through axe-playwright-python, which bundles it) in light
and in dark mode with something on it to show, and at a phone's width (390 px) with no
sideways scroll. A serious or critical violation fails the test with axe's own account of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page

from tests.e2e.conftest import LiveStack, log_in, screenshot

pytestmark = pytest.mark.e2e

PAGES = (
    "/demo",
    "/demo/cron",
    "/demo/jobs",
    "/demo/events",
    "/demo/worker",
    "/demo/guide/jobs",
    "/demo/source?path=app/jobs/email.py",
    "/docs",
    "/admin/",
    "/admin/dlq/EmailJob",
    "/admin/search?id=no-such-job",
)
BLOCKING = {"serious", "critical"}


def _post(page: Page, url: str, body: dict[str, object]) -> None:
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    assert token is not None
    response = page.request.post(url, data=body, headers={"X-CSRF-Token": token})
    assert response.ok, response.text()


@pytest.fixture(scope="module")
def stocked(live_stack: LiveStack, browser: Browser) -> LiveStack:
    """Pages with rows in them: a DLQ item, job cards, a signup and its listeners."""
    context = browser.new_context()
    page = context.new_page()
    log_in(page, live_stack.url)
    _post(page, live_stack.url + "/api/demo/jobs", {"to": "ada@example.com", "mode": "fail"})
    _post(page, live_stack.url + "/api/demo/jobs", {"to": "bob@example.com", "mode": "ok"})
    _post(
        page,
        live_stack.url + "/api/demo/events/signup",
        {"email": "fail@example.com", "mode": "ok"},
    )
    _post(page, live_stack.url + "/api/demo/cron/run", {})
    context.close()
    return live_stack


@pytest.fixture(params=["light", "dark"])
def scheme_page(
    browser: Browser, stocked: LiveStack, request: pytest.FixtureRequest
) -> Iterator[object]:
    context = browser.new_context(
        viewport={"width": 1280, "height": 860}, color_scheme=request.param
    )
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, stocked.url)
    yield page
    context.close()


def _blocking(page: Page) -> list[str]:
    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} -> "
        + "; ".join(" ".join(node["target"]) for node in v["nodes"][:4])
        for v in results.response["violations"]
        if v["impact"] in BLOCKING
    ]


@pytest.mark.parametrize("live_stack", ["nats"], indirect=True)
def test_no_serious_or_critical_violation_on_any_page(
    scheme_page: Page, stocked: LiveStack
) -> None:
    found = {}
    for path in PAGES:
        scheme_page.goto(stocked.url + path)
        scheme_page.wait_for_load_state("networkidle")
        if problems := _blocking(scheme_page):
            found[path] = problems
        scheme = scheme_page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches")
        name = path.strip("/").split("?")[0].replace("/", "-") or "console"
        screenshot(scheme_page, f"{'dark' if scheme else 'light'}-{name}")
    assert not found, "\n".join(f"{path}: {p}" for path, ps in found.items() for p in ps)


@pytest.mark.parametrize("live_stack", ["nats"], indirect=True)
def test_the_login_page_passes_in_both_schemes(browser: Browser, live_stack: LiveStack) -> None:
    for scheme in ("light", "dark"):
        context = browser.new_context(color_scheme=scheme)
        page = context.new_page()
        page.goto(live_stack.url + "/login")
        assert _blocking(page) == []
        context.close()


@pytest.mark.parametrize("live_stack", ["nats"], indirect=True)
def test_every_page_fits_a_390_px_phone(browser: Browser, stocked: LiveStack) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    log_in(page, stocked.url)
    wide = {}
    for path in PAGES:
        page.goto(stocked.url + path)
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 390:
            wide[path] = width
    screenshot(page, "mobile-source")
    page.goto(stocked.url + "/demo/jobs")
    screenshot(page, "mobile-jobs")
    context.close()
    assert not wide, f"pages wider than the screen: {wide}"
