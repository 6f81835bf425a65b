"""The login form in a browser: an over-long username is answered on the form, at its field, in
light and dark and at a phone's width."""

from __future__ import annotations

from typing import Literal

import pytest
from playwright.sync_api import Browser

from tests.e2e.conftest import LiveStack, screenshot
from tests.e2e.test_accessibility import _blocking

pytestmark = pytest.mark.e2e

SENTENCE = "Username must be at most 200 characters."


@pytest.mark.parametrize("live_stack", ["nats"], indirect=True)
@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 390])
def test_an_over_long_username_is_answered_at_its_field(
    browser: Browser, live_stack: LiveStack, scheme: Literal["light", "dark"], width: int
) -> None:
    context = browser.new_context(
        viewport={"width": width, "height": 860}, color_scheme=scheme, is_mobile=width < 600
    )
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        page.goto(live_stack.url + "/login")
        page.fill("input[name=username]", "u" * 300)
        page.fill("input[name=password]", "whatever")
        with page.expect_navigation() as answer:
            page.click("button[type=submit]")
        assert answer.value.status == 422
        assert answer.value.headers["content-type"].startswith("text/html")
        error = page.locator("#error-username")
        assert error.inner_text() == SENTENCE
        assert error.is_visible()
        username = page.locator("input[name=username]")
        assert username.get_attribute("aria-invalid") == "true"
        assert username.input_value() == "u" * 300  # kept, to be shortened
        assert page.locator("#error-password").inner_text() == ""
        assert page.locator("[role=alert]").count() == 0  # no generic error besides
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert _blocking(page) == []
        screenshot(page, f"login-error-{scheme}-{width}")
    finally:
        context.close()
