"""Rendering a page with the app's templates (one helper, typed, for framework and app), and
one-time messages across a redirect.

A form posts, the handler redirects (303), the browser gets the page: the message for that page
("Job 4f2a enqueued.") travels in a signed cookie set by `flash(...)`, and `render` hands it to
the next page as `flash` and clears it. Never put such text in the query string: a link could
then make the page say anything ("?notice=Your account is locked, call ..."), and a reload
would say it again.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from fastapi import Request, Response
from fastapi.templating import Jinja2Templates

from mega.constants import FLASH_COOKIE
from mega.web import auth

# A flash waits this long for its page (a redirect is followed at once).
FLASH_MAX_AGE_S = 60
FLASH_MAX_CHARS = 500


def render(
    request: Request, template: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    """Render `template` with `context`; the templates also see `csrf_token`, `user` and
    `flash` (the one-time message a redirect brought, or None, cleared once shown).

    Args:
        request: the request being answered.
        template: the template's path, in the app's templates folder or else the framework's.
        context: the template's variables.
        status_code: the HTTP status of the page.
    """
    templates: Jinja2Templates = request.app.state.templates
    message = _take_flash(request)
    response = templates.TemplateResponse(
        request, template, {"flash": message, **context}, status_code=status_code
    )
    if FLASH_COOKIE in request.cookies:
        response.delete_cookie(FLASH_COOKIE, path="/")
    return response


def flash(request: Request, response: Response, message: str) -> Response:
    """Show `message` once on the next page this browser renders (see the module docstring).

    Args:
        request: the request being answered (over https, the cookie is `secure`).
        response: the answer that carries the cookie, usually a 303 redirect; it is returned.
        message: the text to show, cut at FLASH_MAX_CHARS characters.
    """
    encoded = base64.urlsafe_b64encode(message[:FLASH_MAX_CHARS].encode()).decode()
    response.set_cookie(
        FLASH_COOKIE,
        auth.sign(encoded, auth.settings(request).secret_key),
        max_age=FLASH_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


def _take_flash(request: Request) -> str | None:
    signed = auth.unsign(request.cookies.get(FLASH_COOKIE), auth.settings(request).secret_key)
    if signed is None:
        return None
    try:
        return base64.urlsafe_b64decode(signed.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
