"""What every form's field errors look like in the browser (static/js/common.js fieldErrors):
the sentence in the element right after its input, the input aria-invalid and described by it."""

from __future__ import annotations

from playwright.sync_api import Page, expect

# The sentences the server words (mega.web.fields), as a person reads them at the field.
DELAY = "must be a whole number of milliseconds from 0 to 60000"
HOLD = DELAY
COUNT = "must be a whole number from 1 to 50"
ROUNDS = "must be a whole number from 1 to 50000000"
TIMEOUT = "must be a whole number of milliseconds from 1 to 60000"
INLINE_CAP = (
    "must be a whole number from 1 to 8000000 for an inline run, which stalls every user "
    "(the pool takes up to 50000000)"
)
EMAIL = "is not a valid e-mail address (one like name@example.com, at most 254 characters)"


def expect_field_error(page: Page, field: str, message: str) -> None:
    """`message`, exactly, sits right after the input `field` (a selector), which says so."""
    error = page.locator(f"{field} + .field-error")
    expect(error).to_have_text(message)
    expect(page.locator(field)).to_have_attribute("aria-invalid", "true")
    described = (page.locator(field).get_attribute("aria-describedby") or "").split()
    assert error.get_attribute("id") in described, described


def expect_no_field_error(page: Page, field: str) -> None:
    expect(page.locator(f"{field} + .field-error")).to_have_text("")
    expect(page.locator(field)).not_to_have_attribute("aria-invalid", "true")
