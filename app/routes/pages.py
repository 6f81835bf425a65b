"""The console and the three demo pages (HTML). Their JSON lives beside them in routes/api_*.py.

Pages render their first state on the server (they work without JavaScript); the per-page
script in static/js/ then keeps the panels live by polling the JSON routes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse

from app.routes.api_console import console_state
from app.routes.api_cron import cron_state
from app.routes.api_events import events_page_context
from app.routes.api_jobs import Before, jobs_page_context
from app.routes.api_worker import DIGEST_PATTERN, worker_page_context
from mega.web import UserDep, render

router = APIRouter(include_in_schema=False)


def page(request: Request, template: str, **context: object) -> Response:
    return render(request, template, context)


@router.get("/")
async def index(user: UserDep) -> Response:
    return RedirectResponse("/demo", status_code=303)


@router.get("/demo")
async def console(request: Request, user: UserDep) -> Response:
    state = await console_state(request)
    return page(request, "demo/console.html", title="Console", state=state)


@router.get("/demo/cron")
async def cron_page(request: Request, user: UserDep) -> Response:
    state = await cron_state(request)
    return page(request, "demo/cron.html", title="Schedules", state=state)


@router.get("/demo/worker")
async def worker_page(
    request: Request,
    user: UserDep,
    digest: Annotated[str | None, Query(pattern=DIGEST_PATTERN)] = None,
    rounds: int | None = None,
    ms: float | None = None,
    mode: Literal["pool", "inline"] = "pool",
) -> Response:
    """The result of a form post without JavaScript comes back in the query (a bad field is a
    422 page with its sentence, a failed run a flash)."""
    result = {"digest": digest, "rounds": rounds, "ms": ms, "mode": mode} if digest else None
    return page(request, "demo/worker.html", **worker_page_context(request, result=result))


@router.get("/demo/jobs")
async def jobs_page(request: Request, user: UserDep, before: Before = None) -> Response:
    """The newest jobs, or with `?before=<id>` the page of those older than that job."""
    return page(request, "demo/jobs.html", **await jobs_page_context(request, before=before))


@router.get("/demo/events")
async def events_page(request: Request, user: UserDep) -> Response:
    return page(request, "demo/events.html", **await events_page_context(request))
