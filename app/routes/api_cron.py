"""The CronCounter demo: its state as JSON, a manual tick, pause and resume, and the page's no-JS
form targets.

Pause and resume write the schedule's pause record (the Scheduler's): every `mega scheduler`
reads it before it claims a tick, so within a tick the whole fleet skips with the reason
"paused", and the change itself is a row of the audit. A manual tick still runs while paused.

A manual tick may ask to hold its run (`hold_ms`, 0 to 60000): the run keeps the overlap guard
for that long, so a tick planned inside the hold is skipped ("overlap") and the audit shows it.
The request answers once the run has started holding (the hold goes on in the background), or
at once when the tick was skipped. Bad input is a 422 with field errors and runs nothing.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, ValidationError

from app.deps import main_redis, scheduler
from app.schedules.cron_counter import CronCounterSchedule
from app.services.cron_counter import (
    HOLD_EXTRA,
    HOLD_STARTED_EXTRA,
    MAX_HOLD_MS,
    SUGGESTED_HOLD_MS,
    read_state,
)
from app.services.instances import short_instance
from mega.web import (
    CurrentUser,
    OperatorDep,
    UserDep,
    WholeNumber,
    api_responses,
    audited,
    field_errors,
    flash,
    form_number,
    ok,
    render,
)

router = APIRouter()
SCHEDULE = CronCounterSchedule.name
# Manual ticks still holding, kept referenced so that they are not collected mid-hold.
HOLDING: set[asyncio.Task[Any]] = set()


def as_utc(instant: str) -> str:
    """An ISO instant in UTC, the one zone of every page and of the logs."""
    return datetime.fromisoformat(instant).astimezone(UTC).isoformat()


def instance_label(instance: str | None) -> str | None:
    """`scheduler@host:4121:a1b2c3` -> `scheduler a1b2c3 (pid 4121)`: short enough for a phone,
    the role says whether a process ticked or the web app ran a manual tick, the pid is what to
    kill (the console and the jobs page name instances the same way)."""
    if instance is None:
        return None
    role, _, _ = instance.partition("@")
    return f"{role} {short_instance(instance)}"


def scheduler_processes(ticks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `mega scheduler` processes seen in the audit, with the pid to stop one by hand
    (instance ids read ``scheduler@<host>:<pid>:<random>``)."""
    seen: dict[str, dict[str, Any]] = {}
    for tick in ticks:
        names = [tick["winner"], *(s["instance"] for s in tick["skipped"])]
        for name in names:
            if name and name.startswith("scheduler@") and name not in seen:
                pid = name.split(":")[1] if name.count(":") >= 2 else ""
                seen[name] = {
                    "instance": name,
                    "label": instance_label(name),
                    "pid": int(pid) if pid.isdigit() else None,
                }
    return list(seen.values())


def clock(at_ms: int) -> str:
    """HH:MM:SS (UTC), as the page's other times."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%H:%M:%S")


def pause_view(paused: bool, at_ms: int | None, by: str | None) -> dict[str, Any]:
    """The pause record as JSON, with the page's sentence about it."""
    who = by or "someone"
    if paused:
        since = f" since {clock(at_ms)} UTC" if at_ms else ""
        text = (
            f"Paused by {who}{since}: every scheduler skips its ticks (reason paused); "
            "Run now still runs."
        )
    elif at_ms:
        text = f"Ticking. Resumed by {who} at {clock(at_ms)} UTC."
    else:
        text = "Ticking."
    return {"paused": paused, "at_ms": at_ms, "by": by, "text": text}


async def cron_state(request: Request) -> dict[str, Any]:
    state = await read_state(main_redis(request))
    settings = scheduler(request).describe(SCHEDULE)
    ticks = await scheduler(request).recent_ticks(SCHEDULE, limit=15)
    pause = await scheduler(request).paused(SCHEDULE)
    return {
        **state,
        "pause": pause_view(pause.paused, pause.at_ms, pause.by),
        "history": [
            {"at": as_utc(h["at"]), "source": h["source"], "fence": h.get("fence")}
            for h in state["history"]
        ],
        # In the schedule's zone, where the cron is read; the page shows them in UTC beside it.
        "next_runs": settings["next_runs"],
        "next_runs_utc": [as_utc(at) for at in settings["next_runs"]],
        "cron": settings["cron"],
        "timezone": settings["timezone"],
        "lock": settings["lock"],
        "ticks": [
            {
                "instant": as_utc(t["instant"]),
                "source": t["source"],
                "winner": t["winner"],
                "winner_label": instance_label(t["winner"]),
                "fence": t["fence"],
                "lateness_ms": t["lateness_ms"],
                "skipped": [{**s, "label": instance_label(s["instance"])} for s in t["skipped"]],
            }
            for t in ticks
        ],
        "schedulers": scheduler_processes(ticks),
        "max_hold_ms": MAX_HOLD_MS,
        "suggested_hold_ms": SUGGESTED_HOLD_MS,
    }


class CronRunRequest(BaseModel):
    # Keep the manual run (and so the overlap guard) going this long; over the 30 s period,
    # the next tick falls inside it and is skipped.
    hold_ms: Annotated[int, WholeNumber(0, MAX_HOLD_MS, unit="milliseconds")] = 0


class CronRun(BaseModel):
    ran: bool
    reason: str | None = None  # why it was skipped
    error: str | None = None  # what the run raised
    hold_ms: int | None = None  # the run holds the overlap guard this long, from now
    hold_until: str | None = None  # when the hold ends (ISO-8601, UTC)


async def manual_tick(request: Request, hold_ms: int) -> dict[str, Any]:
    """Run one tick now; with a hold, answer as soon as the run holds (or was skipped)."""
    if not hold_ms:
        result = await scheduler(request).run_now(SCHEDULE)
    else:
        started = asyncio.Event()
        extras = {HOLD_EXTRA: hold_ms, HOLD_STARTED_EXTRA: started}
        run = asyncio.create_task(scheduler(request).run_now(SCHEDULE, extras=extras))
        HOLDING.add(run)
        run.add_done_callback(HOLDING.discard)
        holding = asyncio.create_task(started.wait())
        await asyncio.wait({run, holding}, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            until = datetime.now(UTC) + timedelta(milliseconds=hold_ms)
            return {"ran": True, "hold_ms": hold_ms, "hold_until": until.isoformat()}
        holding.cancel()
        result = run.result()
    data: dict[str, Any] = {"ran": result.ran}
    if not result.ran:
        data["reason"] = result.reason
    elif result.error:
        data["error"] = result.error
    return data


def outcome_text(data: dict[str, Any]) -> str:
    """The page's one-line account of a manual tick."""
    if not data["ran"]:
        return f"Manual tick skipped: {data['reason']}."
    if "error" in data:
        return f"Manual tick ran and failed: {data['error']}"
    if "hold_ms" in data:
        return (
            f"Manual tick ran and holds the overlap guard until {data['hold_until'][11:19]} UTC "
            f"({data['hold_ms']} ms): watch the next tick in the audit."
        )
    return "Manual tick ran."


@router.get("/api/demo/cron", responses=api_responses(errors=(401, 503)))
async def get_cron(request: Request, user: UserDep) -> Response:
    return ok(await cron_state(request))


@router.post("/api/demo/cron/run", responses=api_responses(CronRun, errors=(401, 403, 422, 503)))
async def run_cron(
    request: Request, user: OperatorDep, body: Annotated[CronRunRequest | None, Body()] = None
) -> Response:
    """Run the schedule now (a manual tick): an operator's action (403 for a viewer)."""
    await audited(request, user, "run now", f"schedule:{SCHEDULE}")
    return ok(await manual_tick(request, body.hold_ms if body else 0))


class PauseAnswer(BaseModel):
    paused: bool
    at_ms: int | None = None  # when it changed (epoch ms)
    by: str | None = None  # who changed it
    text: str  # the page's sentence about it


async def set_pause(request: Request, user: CurrentUser, *, paused: bool) -> dict[str, Any]:
    """Pause or resume the schedule for every scheduler, in the user's name (audited)."""
    await audited(request, user, "pause" if paused else "resume", f"schedule:{SCHEDULE}")
    change = scheduler(request).pause if paused else scheduler(request).resume
    record = await change(SCHEDULE, by=user.username)
    return pause_view(record.paused, record.at_ms, record.by)


@router.post("/api/demo/cron/pause", responses=api_responses(PauseAnswer, errors=(401, 403, 503)))
async def pause_cron(request: Request, user: OperatorDep) -> Response:
    """Pause the schedule: from the next tick on, every scheduler skips it ("paused")."""
    return ok(await set_pause(request, user, paused=True))


@router.post("/api/demo/cron/resume", responses=api_responses(PauseAnswer, errors=(401, 403, 503)))
async def resume_cron(request: Request, user: OperatorDep) -> Response:
    """Resume the schedule: every scheduler runs its next tick again."""
    return ok(await set_pause(request, user, paused=False))


@router.post("/demo/cron/pause", include_in_schema=False)
async def pause_form(request: Request, user: OperatorDep) -> Response:
    data = await set_pause(request, user, paused=True)
    return flash(request, RedirectResponse("/demo/cron", status_code=303), data["text"])


@router.post("/demo/cron/resume", include_in_schema=False)
async def resume_form(request: Request, user: OperatorDep) -> Response:
    data = await set_pause(request, user, paused=False)
    return flash(request, RedirectResponse("/demo/cron", status_code=303), data["text"])


@router.post("/demo/cron/run", include_in_schema=False)
async def run_cron_form(request: Request, user: OperatorDep) -> Response:
    """The "Run now" form without JavaScript: post, redirect, get (a 422 page on bad input)."""
    form = await request.form()
    raw = str(form.get("hold_ms") or "0")
    try:
        body = CronRunRequest.model_validate({"hold_ms": form_number(raw)})
    except ValidationError as exc:
        state = await cron_state(request)
        context = {
            "title": "Schedules",
            "state": state,
            "form": {"hold_ms": raw},
            "errors": field_errors(exc.errors()),
        }
        return render(request, "demo/cron.html", context, status_code=422)
    await audited(request, user, "run now", f"schedule:{SCHEDULE}")
    data = await manual_tick(request, body.hold_ms)
    return flash(request, RedirectResponse("/demo/cron", status_code=303), outcome_text(data))
