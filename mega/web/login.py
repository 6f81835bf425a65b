"""GET/POST /login and POST /logout. Forms post, redirect, get: they work without JavaScript.

The login form always answers with the form: a missing or wrong CSRF token (403, with a fresh
one), a wrong password (401), a refused try (429 with Retry-After) or an over-long field (422, a
sentence at the field, nothing counted or checked).
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, StringConstraints, ValidationError

from mega.constants import ANON_CSRF_COOKIE, DEVICE_COOKIE, SESSION_COOKIE
from mega.web import accounts, auth
from mega.web.envelope import field_errors
from mega.web.pages import render

router = APIRouter()

GENERIC_LOGIN_ERROR = "Wrong username or password."
# A missing or wrong CSRF token: the page was open too long (another login, a new secret key)
# or the browser refuses cookies. The form comes back with a fresh token.
EXPIRED_FORM_ERROR = (
    "This form has expired, or your browser did not send its cookie. Please log in again."
)
# Far above any real name or passphrase; what is longer is refused before the KDF sees it.
MAX_USERNAME_CHARS = 200
MAX_PASSWORD_CHARS = 1000
# A `next=` longer than this is no page of ours: the login lands on the landing path instead.
MAX_NEXT_CHARS = 2000


class LoginForm(BaseModel):
    """The lengths a login accepts; what is over them is answered at its field (`field_errors`)."""

    username: Annotated[str, StringConstraints(max_length=MAX_USERNAME_CHARS)]
    password: Annotated[str, StringConstraints(max_length=MAX_PASSWORD_CHARS)]


def _next(request: Request, target: str | None) -> str:
    if target is not None and len(target) > MAX_NEXT_CHARS:
        target = None
    return accounts.safe_next(target, auth.settings(request).landing_path)


def wait_sentence(wait_s: int) -> str:
    """What a refused try is told: the same words whichever limit refused it."""
    if wait_s >= 120:
        minutes = math.ceil(wait_s / 60)
        return f"Too many attempts. Try again in {minutes} minutes."
    return f"Too many attempts. Try again in {wait_s} second{'s' if wait_s != 1 else ''}."


@router.api_route(auth.LOGIN_PATH, methods=["GET", "HEAD"], include_in_schema=False)
async def login_page(request: Request, next: str | None = None) -> Response:
    if await auth.current_user(request):
        return RedirectResponse(_next(request, next), status_code=303)
    return _render(request, next=_next(request, next))


@router.post(auth.LOGIN_PATH, include_in_schema=False)
async def login(
    request: Request,
    username: Annotated[str, Form()] = "",
    password: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "",
) -> Response:
    target = _next(request, next)
    if not await auth.csrf_valid(request):
        return _render(
            request, next=target, username=username, error=EXPIRED_FORM_ERROR, status=403
        )
    try:
        LoginForm(username=username, password=password)
    except ValidationError as exc:
        errors = field_errors(exc.errors())
        return _render(request, next=target, username=username, errors=errors, status=422)
    attempt = await accounts.authenticate(request, username, password, auth.client_ip(request))
    if attempt.retry_after_s:
        error = wait_sentence(attempt.retry_after_s)
        response = _render(request, next=target, username=username, error=error, status=429)
        response.headers["Retry-After"] = str(attempt.retry_after_s)
        return response
    user_id = attempt.user_id
    if user_id is None:
        return _render(
            request, next=target, username=username, error=GENERIC_LOGIN_ERROR, status=401
        )
    # A new session id and a new CSRF token at every login: nothing from before carries over.
    await auth.end_session(request)
    cookie, _csrf = await auth.start_session(request, user_id)
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(ANON_CSRF_COOKIE, path="/")
    config = auth.settings(request)
    secure = request.url.scheme == "https"
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=config.session_max_age_s,
        httponly=True,
        samesite="lax",
        secure=secure,
        path="/",
    )
    # Kept at logout: this browser has logged in, so the account's limit spares it.
    response.set_cookie(
        DEVICE_COOKIE,
        accounts.device_cookie(request, attempt.username),
        max_age=config.device_cookie_max_age_s,
        httponly=True,
        samesite="lax",
        secure=secure,
        path="/",
    )
    return response


@router.post("/logout", include_in_schema=False)
async def logout(request: Request) -> Response:
    await auth.end_session(request)
    request.state.user = None
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def _render(
    request: Request,
    *,
    next: str,
    username: str = "",
    error: str | None = None,
    errors: dict[str, str] | None = None,
    status: int = 200,
) -> Response:
    context = {
        "next": next,
        "username": username,
        "error": error,
        "errors": errors or {},
        "title": "Log in",
    }
    return render(request, "login.html", context, status_code=status)
