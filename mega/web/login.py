"""GET/POST /login and POST /logout. Forms post, redirect, get: they work without JavaScript."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse

from mega.constants import ANON_CSRF_COOKIE, SESSION_COOKIE
from mega.web import auth
from mega.web.pages import render

router = APIRouter()

GENERIC_LOGIN_ERROR = "Wrong username or password."


def _client_ip(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _next(request: Request, target: str | None) -> str:
    return auth.safe_next(target, auth.settings(request).landing_path)


@router.api_route("/login", methods=["GET", "HEAD"], include_in_schema=False)
async def login_page(request: Request, next: str | None = None) -> Response:
    if await auth.current_user(request):
        return RedirectResponse(_next(request, next), status_code=303)
    return _render(request, next=_next(request, next))


@router.post("/login", include_in_schema=False)
async def login(
    request: Request,
    username: Annotated[str, Form(max_length=200)] = "",
    password: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "",
) -> Response:
    target = _next(request, next)
    attempt = await auth.authenticate(request, username, password, _client_ip(request))
    if attempt.retry_after_s:
        wait = attempt.retry_after_s
        error = f"Too many attempts. Try again in {wait} second{'s' if wait != 1 else ''}."
        response = _render(request, next=target, username=username, error=error, status=429)
        response.headers["Retry-After"] = str(wait)
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
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=auth.settings(request).session_max_age_s,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
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
    request: Request, *, next: str, username: str = "", error: str | None = None, status: int = 200
) -> Response:
    context = {"next": next, "username": username, "error": error, "title": "Log in"}
    return render(request, "login.html", context, status_code=status)
