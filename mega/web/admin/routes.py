"""The admin router: the operator's view of the whole fleet, for any app that uses mega.

    from mega.web import admin_router, create_web_app

    app = create_web_app(config, ctx, routers=[admin_router(prefix="/admin")])

Pages (all behind the login; an API token works too):

    GET  {prefix}/                       every job queue and listener group, their workers, the
                                         scheduler instances and the schedules
    GET  {prefix}/jobs/{id}              one job's whole life, its result, its dead letter
    GET  {prefix}/search?id=...          finds the id in every job queue's status records
    GET  {prefix}/dlq/{job}              a job queue's dead letters, newest first, 50 a page
    GET  {prefix}/listeners/{group}/dlq  a listener group's dead letters, the same way
    POST {dlq page}/retry, /delete       one dead letter (form field `id`)
    GET  {dlq page}/purge, POST          the purge, after a confirm step
    POST {prefix}/schedules/{name}/pause, /resume, /run

What it shows comes from the app's registry: the config's `jobs`, `listeners` and `schedules`
(or the lists given to `admin_router`), read through the app's own JobQueue per bus
(`mega.web.job_queue`) and the app's Scheduler when it `provide`d one. The pages' shared state
is in console.py, the dead-letter and schedule actions in actions.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, RedirectResponse

from mega import audit
from mega.errors import JobError, MegaError
from mega.jobs.queue import JobQueue
from mega.schedules.scheduler import Scheduler
from mega.web.admin import fleet, job_views
from mega.web.admin.actions import add_dlq_routes, add_schedule_route
from mega.web.admin.console import (
    STYLESHEET,
    Admin,
    IdQuery,
    Lane,
)
from mega.web.auth import UserDep, database


def admin_router(
    prefix: str = "/admin",
    *,
    jobs: Sequence[type[Any]] | None = None,
    listeners: Sequence[type[Any]] | None = None,
    schedules: Sequence[type[Any]] | None = None,
    title: str = "Fleet",
) -> APIRouter:
    """The admin pages under `prefix`, for `create_web_app(..., routers=[...])`.

    Args:
        prefix: the path the pages are under (a trailing "/" is dropped).
        jobs: the Job classes whose queues the pages show; None is the config's `jobs`.
        listeners: the Listener classes whose groups they show; None is the config's
            `listeners`.
        schedules: the Schedule classes they show; None is the config's `schedules`.
        title: the overview's heading, and the name of the link back to it on every page.
    """
    admin = Admin(prefix, jobs, listeners, schedules, title)
    router = APIRouter(prefix=admin.prefix, include_in_schema=False)

    @router.get("/admin.css")
    async def stylesheet() -> Response:
        return FileResponse(STYLESHEET, media_type="text/css")

    @router.get("/")
    async def overview(request: Request, user: UserDep) -> Response:
        return admin.page(request, "overview.html", **await overview_data(admin, request))

    @router.get("/search")
    async def search(request: Request, user: UserDep, id: IdQuery = "") -> Response:
        job_id = id.strip()
        if not job_id:
            return admin.page(request, "search.html", status_code=200, job_id="", lanes=[])
        found = await find_job(admin, request, job_id)
        if found is not None:
            return RedirectResponse(admin.job_url(job_id, found[0].name), status_code=303)
        if await find_workflow(admin, request, job_id) is not None:
            return RedirectResponse(admin.workflow_url(job_id), status_code=303)
        return not_found(admin, request, job_id)

    # `:path`: an id may hold a `/` (tenant/7), which its URL quotes and the server unquotes.
    @router.get("/jobs/{job_id:path}")
    async def job_page(
        request: Request, user: UserDep, job_id: str, job: str | None = None
    ) -> Response:
        if job is not None:
            lane = admin.lane(request, "job", job)
            status = await lane.endpoint.status(lane.cls, job_id)  # type: ignore[union-attr]
            found = (lane, status) if status is not None else None
        else:
            found = await find_job(admin, request, job_id)
        if found is None:
            return not_found(admin, request, job_id)
        return admin.page(request, "job.html", **await job_data(admin, request, *found))

    @router.get("/workflows/{workflow_id:path}")
    async def workflow_page(request: Request, user: UserDep, workflow_id: str) -> Response:
        status = await find_workflow(admin, request, workflow_id)
        if status is None:
            return not_found(admin, request, workflow_id)
        return admin.page(request, "workflow.html", **workflow_data(admin, status))

    for kind, path in (("job", "/dlq/{name}"), ("group", "/listeners/{name}/dlq")):
        add_dlq_routes(router, admin, kind, path)

    for action in ("pause", "resume", "run"):
        add_schedule_route(router, admin, action)
    return router


# -- the overview -----------------------------------------------------------------------------


async def lane_view(admin: Admin, request: Request, lane: Lane) -> fleet.LaneView:
    view = fleet.LaneView(lane.kind, lane.name, lane.bus, lane.cls, admin.dlq_url(lane))
    try:
        stats = await lane.endpoint.stats(lane.cls)
        view.stats = stats
        view.oldest = fleet.oldest_text(stats)
        key = (lane.kind, lane.bus, lane.name)
        view.rate = fleet.rate_text(admin.state(request).rates.rate(key, stats))
        if isinstance(lane.endpoint, JobQueue) and lane.endpoint.spec(lane.cls).keep_status_s:
            view.paused = (await lane.endpoint.paused(lane.cls)).paused
        workers = getattr(lane.endpoint, "workers", None)
        if workers is not None:
            view.workers = fleet.worker_rows(await workers(lane.cls))
    except MegaError as exc:
        view.error = fleet.error_text(exc)
    return view


async def schedule_view(scheduler: Scheduler, name: str) -> dict[str, Any]:
    settings = scheduler.describe(name)
    view: dict[str, Any] = {"name": name, "settings": settings, "error": None}
    view["next_utc"] = fleet.tick_rows(
        [
            {"instant": at, "source": "", "winner": None, "skipped": []}
            for at in settings["next_runs"][:1]
        ]
    )
    try:
        pause = await scheduler.paused(name)
        ticks = await scheduler.recent_ticks(name, limit=fleet.RECENT_TICKS)
    except MegaError as exc:
        view.update(
            error=fleet.error_text(exc),
            paused=False,
            pause_text="",
            ticks=[],
            instances=[],
            lockless=False,
        )
        return view
    view.update(
        paused=pause.paused,
        pause_text=fleet.pause_text(pause.paused, pause.at_ms, pause.by),
        lockless=settings["lock"] is None,
        ticks=fleet.tick_rows(ticks[: fleet.AUDIT_ROWS]),
        instances=fleet.scheduler_instances(ticks),
    )
    return view


async def overview_data(admin: Admin, request: Request) -> dict[str, Any]:
    # Each lane's reads at once: the page answers in about the time of one lane's, not the sum.
    lanes = [*admin.job_lanes(request), *admin.group_lanes(request)]
    views = await asyncio.gather(*(lane_view(admin, request, lane) for lane in lanes))
    jobs = [view for view in views if view.kind == "job"]
    groups = [view for view in views if view.kind == "group"]
    scheduler = admin.scheduler(request)
    schedules = [await schedule_view(scheduler, name) for name in scheduler.names]
    actions = await database(request).run(
        lambda db: {
            s["name"]: audit.entries(db, target=f"schedule:{s['name']}", limit=5) for s in schedules
        }
    )
    for schedule in schedules:
        schedule["actions"] = fleet.action_rows(actions[schedule["name"]])
    instances = fleet.merge_instances(s["instances"] for s in schedules)
    return {
        "title": admin.title,
        "jobs": jobs,
        "groups": groups,
        "schedules": schedules,
        "instances": fleet.instance_rows(instances),
    }


# -- one job ------------------------------------------------------------------------------------


async def find_job(admin: Admin, request: Request, job_id: str) -> tuple[Lane, Any] | None:
    """The first job lane whose status store has a record of `job_id`, with the record."""
    for lane in admin.job_lanes(request):
        try:
            status = await lane.endpoint.status(lane.cls, job_id)  # type: ignore[union-attr]
        except MegaError:
            continue  # an unreachable bus: the other lanes may still know it
        if status is not None:
            return lane, status
    return None


async def find_workflow(admin: Admin, request: Request, workflow_id: str) -> Any:
    """The workflow of this id on the first bus of the job lanes that has it, or None."""
    queues = {lane.bus: lane.endpoint for lane in admin.job_lanes(request)}
    for queue in queues.values():
        assert isinstance(queue, JobQueue)
        try:
            status = await queue.status(workflow_id)
        except MegaError:
            continue  # an unreachable bus: another may still know it
        if status is not None:
            return status
    return None


def workflow_data(admin: Admin, status: Any) -> dict[str, Any]:
    steps = [*status.steps, *([status.then] if status.then is not None else [])]
    return {
        "title": f"Workflow {status.id}",
        "status": status,
        "summary": job_views.workflow_view(status),
        "steps": [job_views.step_row(step, admin.job_url(step.id, step.job)) for step in steps],
        "has_then": status.then is not None,
    }


def not_found(admin: Admin, request: Request, job_id: str) -> Response:
    """The search page that says no job (nor workflow) has this id, and how long each job
    queue keeps its records."""
    return admin.page(
        request, "search.html", status_code=404, job_id=job_id, lanes=keeps(admin, request)
    )


def keeps(admin: Admin, request: Request) -> list[dict[str, Any]]:
    """How long each job queue keeps its status records, for the page that found nothing."""
    return [
        {"name": lane.name, "keep": _kept(lane.endpoint.spec(lane.cls).keep_status_s)}  # type: ignore[union-attr]
        for lane in admin.job_lanes(request)
    ]


def _kept(keep_status_s: float) -> str:
    if not keep_status_s:
        return "none (keep_status_s = 0)"
    return f"{fleet.age(keep_status_s)} ({keep_status_s:g} s)"


async def job_data(admin: Admin, request: Request, lane: Lane, status: Any) -> dict[str, Any]:
    queue = lane.endpoint
    assert isinstance(queue, JobQueue)
    result: dict[str, Any] | None = None
    if status.state == "done" and status.result_kept:
        try:
            result = {
                "json": fleet.pretty_json(await queue.result(lane.cls, status.id, timeout_s=2))
            }
        except (JobError, TimeoutError) as exc:
            result = {"error": fleet.error_text(exc)}
    dead = None
    if status.state == "dlq":
        record = await queue.dlq.get(lane.cls, status.id)
        dead = None if record is None else job_views.dead_letter_view(record)
    cause = status.cause
    return {
        "title": f"Job {status.id}",
        "lane": lane,
        "status": status,
        "summary": job_views.status_view(status),
        "attempts": job_views.attempt_rows(status),
        "result": result,
        "dead": dead,
        "dlq_url": admin.dlq_url(lane),
        "cause": None
        if cause is None
        else job_views.cause_view(cause, admin.url(f"/jobs/{cause.id}")),
        "workflow": job_views.workflow_link(status.id, admin.workflow_url),
        "actions": fleet.action_rows(
            await database(request).run(
                lambda db: audit.entries(db, target=f"job:{lane.name}", job_id=status.id)
            )
        ),
    }
