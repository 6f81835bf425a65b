"""The CronCounter demo: its state as JSON, a manual tick, and the page's no-JS form target."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel

from app.schedules.cron_counter import CronCounterSchedule
from app.services.cron_counter import read_state
from mega import Scheduler
from mega.web import UserDep, api_responses, flash, ok

router = APIRouter()
SCHEDULE = CronCounterSchedule.name


def scheduler(request: Request) -> Scheduler:
    """The web process's Scheduler: registered, never started; it serves run_now and reads."""
    found: Scheduler = request.app.state.scheduler
    return found


def in_zone(instant: str, zone: str | None) -> str:
    """An ISO instant (UTC in the records) in the schedule's time zone: one zone per page."""
    moment = datetime.fromisoformat(instant)
    return moment.astimezone(ZoneInfo(zone)).isoformat() if zone else moment.isoformat()


async def cron_state(request: Request) -> dict[str, Any]:
    state = await read_state(request.app.state.ctx.cache("main").native)
    settings = scheduler(request).describe(SCHEDULE)
    ticks = await scheduler(request).recent_ticks(SCHEDULE, limit=15)
    zone = settings["timezone"]
    return {
        **state,
        "history": [
            {"at": in_zone(h["at"], zone), "source": h["source"]} for h in state["history"]
        ],
        "next_runs": settings["next_runs"],
        "cron": settings["cron"],
        "timezone": settings["timezone"],
        "lock": settings["lock"],
        "ticks": [
            {
                "instant": in_zone(t["instant"], zone),
                "source": t["source"],
                "winner": t["winner"],
                "fence": t["fence"],
                "lateness_ms": t["lateness_ms"],
                "skipped": t["skipped"],
            }
            for t in ticks
        ],
    }


class CronRun(BaseModel):
    ran: bool
    reason: str | None = None  # why it was skipped
    error: str | None = None  # what the run raised


@router.get("/api/demo/cron", responses=api_responses(errors=(401, 503)))
async def get_cron(request: Request, user: UserDep) -> Response:
    return ok(await cron_state(request))


@router.post("/api/demo/cron/run", responses=api_responses(CronRun, errors=(401, 403, 503)))
async def run_cron(request: Request, user: UserDep) -> Response:
    result = await scheduler(request).run_now(SCHEDULE)
    data: dict[str, Any] = {"ran": result.ran}
    if not result.ran:
        data["reason"] = result.reason
    elif result.error:
        data["error"] = result.error
    return ok(data)


@router.post("/demo/cron/run", include_in_schema=False)
async def run_cron_form(request: Request, user: UserDep) -> Response:
    """The "Run now" button without JavaScript: post, redirect, get."""
    result = await scheduler(request).run_now(SCHEDULE)
    message = (
        "Manual tick ran."
        if result.ran and not result.error
        else "Manual tick skipped: a run was in progress."
    )
    return flash(request, RedirectResponse("/demo/cron", status_code=303), message)
