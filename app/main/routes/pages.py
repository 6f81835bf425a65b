"""The console and the three demo pages (HTML). Their JSON lives beside them in routes/api_*.py.

Pages render their first state on the server (they work without JavaScript); the per-page
script in static/js/ then keeps the panels live by polling the JSON routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.main.routes.api_cron import cron_state
from app.mega.web.auth import UserDep

router = APIRouter(include_in_schema=False)


def render(request: Request, template: str, **context: object) -> Response:
    templates = request.app.state.templates
    return templates.TemplateResponse(request, template, context)  # type: ignore[no-any-return]


@router.get("/")
async def index(user: UserDep) -> Response:
    return RedirectResponse("/demo", status_code=303)


@router.get("/demo")
async def console(request: Request, user: UserDep) -> Response:
    return render(request, "demo/console.html", title="Console")


@router.get("/demo/cron")
async def cron_page(request: Request, user: UserDep, manual: str | None = None) -> Response:
    state = await cron_state(request)
    return render(request, "demo/cron.html", title="Schedules", state=state, manual=manual)


@router.get("/demo/{name}")
async def coming(request: Request, name: str, user: UserDep) -> Response:
    titles = {"jobs": "Jobs", "worker": "CPU worker"}
    if name not in titles:
        return render(request, "error.html", title="Not found", message="There is no such demo.")
    return render(request, "demo/coming.html", title=titles[name])
