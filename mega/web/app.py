"""`create_web_app`: the FastAPI app every mega application starts from.

It wires the JSON envelope, security headers, CSRF on every unsafe request of a cookie
session, API tokens (`Authorization: Bearer`, mega/web/tokens.py: no CSRF token needed),
login/logout, `/healthz`, `/readyz` and `/metrics`, and the templates; the application adds its
own routers, and `public_routers` for routes with no login at all.
Templates are looked up in the application's `templates/` folder first, then in the framework's
own (`mega/web/templates/`: plain `base.html`, `login.html` and `error.html`), so an application
restyles the login page by shipping its own `login.html`, and works without one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mega import tracing
from mega.config import Config
from mega.constants import ANON_CSRF_COOKIE, CSRF_HEADER
from mega.context import Context
from mega.web import auth
from mega.web.envelope import fail, install_error_handlers
from mega.web.health import router as health_router
from mega.web.login import router as login_router
from mega.web.pages import render

logger = logging.getLogger("mega.web")

# The framework's fallback templates, after the application's own.
FRAMEWORK_TEMPLATES = Path(__file__).with_name("templates")
# No form or JSON body of this app comes near this; anything larger is refused unread.
MAX_BODY_BYTES = 64 * 1024
BODY_LIMIT = f"the request body is over the {MAX_BODY_BYTES // 1024} KiB limit"


class BodyTooLarge(HTTPException):
    """Raised while a body streams in (chunked, or longer than it said): the answer is the
    same 422 as for a Content-Length over the limit, and nothing more is read."""

    def __init__(self) -> None:
        super().__init__(422, BODY_LIMIT)


class BodyLimit:
    """Counts a request's body as it arrives and stops it at `max_bytes`: a chunked body, or one
    longer than its Content-Length, is never read (nor parsed) in full."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        await self.app(scope, counted, send)


SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
        "base-uri 'self'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def create_web_app(
    config: Config,
    ctx: Context,
    *,
    routers: Iterable[APIRouter] = (),
    public_routers: Iterable[APIRouter] = (),
    templates_dir: Path | None = None,
    static_dir: Path | None = None,
    title: str = "mega",
) -> FastAPI:
    """The FastAPI app of a mega application, wired as this module's docstring says.

    Args:
        config: the application's config: its `auth` settings, and its `root`, under which
            `templates/` and `static/` are found by default.
        ctx: the booted context, which routes get through `CtxDep`.
        routers: the application's own routers; a route that needs a login says so
            (`UserDep`).
        public_routers: routers whose routes read no login: no session asked, no CSRF token
            (webhooks, a public API).
        templates_dir: the application's templates, looked up before the framework's; None
            is `templates/` under the config's root.
        static_dir: files served under /static when the folder exists; None is `static/`
            under the config's root.
        title: the API's title in its OpenAPI description (/openapi.json).
    """
    app = FastAPI(
        title=title,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(auth.csrf_protect)],
    )
    app.state.ctx = ctx
    app.state.config = config
    app.state.auth = config.auth
    templates = Jinja2Templates(
        directory=[templates_dir or config.root / "templates", FRAMEWORK_TEMPLATES],
        context_processors=[_template_globals],
    )
    app.state.templates = templates
    install_error_handlers(app)
    # Inside the security middleware: an error raised from a body read there would reach the
    # app wrapped in an exception group (BaseHTTPMiddleware reads in a task group).
    app.add_middleware(BodyLimit)
    app.middleware("http")(_security_middleware)
    static = static_dir or config.root / "static"
    if static.is_dir():
        app.mount("/static", StaticFiles(directory=static), name="static")
    app.include_router(health_router)
    app.include_router(login_router)
    for router in routers:
        app.include_router(router)
    # Routes that read no login: no session asked, no CSRF token (webhooks, a public API). A
    # route here that wants a user still gets one from `UserDep`, which asks on its own.
    app.state.public_routes = []
    for router in public_routers:
        app.include_router(router)
        app.state.public_routes.extend(
            (route.path_regex, route.methods)
            for route in router.routes
            if isinstance(route, APIRoute)
        )
    app.add_api_route(
        "/api/{path:path}",
        _api_not_found,
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    app.add_api_route("/openapi.json", _openapi, include_in_schema=False)
    app.add_api_route("/docs", _api_docs, include_in_schema=False)
    _trace_requests(app)
    return app


def _trace_requests(app: FastAPI) -> None:
    """A span per request, by FastAPI's own OpenTelemetry instrumentation, when an SDK is set up
    in this process (the host sets it up from OTEL_TRACES_EXPORTER) and the instrumentation is
    installed (`pip install opentelemetry-instrumentation-fastapi`): the parent of the jobs a
    request enqueues and of the events it adds to the outbox. Without an SDK nothing of it is
    imported. Health checks, metrics scrapes and static files would be most of the traces and
    tell nothing: they are left out."""
    if tracing.tracer() is None:
        return
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        logger.info(
            "traces: no span per request (pip install opentelemetry-instrumentation-fastapi)"
        )
        return
    FastAPIInstrumentor.instrument_app(app, excluded_urls="/healthz,/readyz,/metrics,/static/.*")


async def _openapi(request: Request, user: auth.UserDep) -> Response:
    """FastAPI's description of the JSON routes, for logged-in users only: the contract, with
    the envelope and error models declared (`api_responses`)."""
    return JSONResponse(request.app.openapi())


async def _api_docs(request: Request, user: auth.UserDep) -> Response:
    """The JSON routes as a page (no third-party script: the CSP allows none)."""
    operations = []
    for path, methods in request.app.openapi().get("paths", {}).items():
        for method, operation in methods.items():
            operations.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "summary": operation.get("summary", ""),
                    "description": operation.get("description", ""),
                    "responses": sorted(operation.get("responses", {})),
                }
            )
    return render(request, "api_docs.html", {"title": "API", "operations": operations})


async def _api_not_found(path: str, user: auth.UserDep) -> Response:
    return fail(404, "not_found", f"no API route /api/{path}")


def _template_globals(request: Request) -> dict[str, Any]:
    user = getattr(request.state, "user", None)
    token = user.csrf_token if user else auth.anon_csrf_token(request)
    return {
        "csrf_token": token,
        "user": user,
        "csrf_header": CSRF_HEADER,
        "landing_path": request.app.state.auth.landing_path,
    }


async def _api_refusal(request: Request) -> Response | None:
    """Every unsafe API request but a public route's needs a session or a token: say so (401)
    before a byte of the body is read."""
    if request.method not in auth.UNSAFE_METHODS or not request.url.path.startswith("/api/"):
        return None
    try:
        user = await auth.current_user(request)
    except HTTPException as exc:  # a wrong or revoked API token
        return fail(exc.status_code, "auth.required", str(exc.detail))
    if user is not None or auth.is_public(request):
        return None
    return fail(401, "auth.required", "log in first")


async def _security_middleware(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    length = request.headers.get("content-length", "0")
    response: Response
    if not length.isdigit() or int(length) > MAX_BODY_BYTES:
        response = fail(422, "validation_failed", BODY_LIMIT, fields={"body": BODY_LIMIT})
    elif refusal := await _api_refusal(request):
        response = refusal
    else:
        response = await call_next(request)
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if not request.url.path.startswith("/static/"):
        # Pages and answers may carry a user's data or a CSRF token: no cache keeps a copy.
        response.headers.setdefault("Cache-Control", "no-store")
    new_token = getattr(request.state, "new_anon_csrf", None)
    if new_token and getattr(request.state, "user", None) is None:
        response.set_cookie(
            ANON_CSRF_COOKIE,
            auth.sign(new_token, request.app.state.auth.secret_key),
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path="/",
        )
    return response
