"""The console and the three demo pages (HTML). Their JSON lives beside them in routes/api_*.py.

Pages render their first state on the server (they work without JavaScript); the per-page
script in static/js/ then keeps the panels live by polling the JSON routes.
"""

from __future__ import annotations

import time
from urllib.parse import urlencode

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from app.routes.api_console import console_state
from app.routes.api_cron import cron_state
from app.routes.api_events import events_page_context
from app.routes.api_jobs import jobs_page_context
from app.routes.api_worker import (
    HASH_TIMEOUT_MS,
    MAX_INLINE_ROUNDS,
    POOL,
    HashRequest,
    inline_hash,
)
from app.workers.hash_tasks import MAX_ROUNDS
from mega.web import UserDep, render

router = APIRouter(include_in_schema=False)
# The page's default: about 2 s of hashing here, long enough to watch the heartbeat keep going.
PAGE_ROUNDS = 6_000_000


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
    digest: str | None = None,
    rounds: int | None = None,
    ms: float | None = None,
    mode: str = "pool",
    error: str | None = None,
) -> Response:
    result = {"digest": digest, "rounds": rounds, "ms": ms, "mode": mode} if digest else None
    return page(
        request,
        "demo/worker.html",
        title="CPU worker",
        form={"input": "mega", "rounds": PAGE_ROUNDS},
        max_rounds=MAX_ROUNDS,
        result=result,
        error=error,
        pool=request.app.state.ctx.workers[POOL].stats(),
    )


@router.post("/demo/worker/hash")
async def worker_form(request: Request, user: UserDep) -> Response:
    """The hash form without JavaScript: post, redirect, get (with the result in the query)."""
    form = await request.form()
    mode = "inline" if form.get("mode") == "inline" else "pool"
    try:
        rounds = int(str(form.get("rounds", "")))
        body = HashRequest(input=str(form.get("input", "")), rounds=rounds, inline=mode == "inline")
    except ValueError:
        error = (
            f"rounds must be a whole number from 1 to {MAX_ROUNDS:,} "
            f"({MAX_INLINE_ROUNDS:,} inline); input at most 1000 characters"
        )
        return RedirectResponse(f"/demo/worker?{urlencode({'error': error})}", status_code=303)
    started = time.perf_counter()
    task = {"input": body.input, "rounds": body.rounds}
    if mode == "inline":
        result = inline_hash(request, task)
    else:
        pool = request.app.state.ctx.workers[POOL]
        result = await pool.run("sha256_loop", task, timeout_ms=HASH_TIMEOUT_MS)
    ms = round((time.perf_counter() - started) * 1000, 1)
    query = urlencode({**result, "ms": ms, "mode": mode})
    return RedirectResponse(f"/demo/worker?{query}", status_code=303)


@router.get("/demo/jobs")
async def jobs_page(request: Request, user: UserDep) -> Response:
    return page(request, "demo/jobs.html", **await jobs_page_context(request))


@router.get("/demo/events")
async def events_page(request: Request, user: UserDep) -> Response:
    return page(request, "demo/events.html", **await events_page_context(request))
