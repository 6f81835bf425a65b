"""Log in through the form and see the console; log out."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import LiveStack, log_in, screenshot

pytestmark = pytest.mark.e2e


def test_login_shows_console_and_logout_returns_to_login(page, live_stack: LiveStack) -> None:
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


def test_wrong_password_shows_generic_error(page, live_stack: LiveStack) -> None:
    page.goto(live_stack.url + "/login")
    page.fill("input[name=username]", "demo")
    page.fill("input[name=password]", "not-it")
    page.click("button[type=submit]")
    assert "Wrong username or password" in page.locator(".alert").inner_text()
