"""GET /api/demo/console: one live view over the three abstractions, for the /demo page.

Each part is read independently: a dependency that is down marks its own panel unavailable
and the rest of the console keeps working.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response

from app.deps import hash_pool, main_redis, queue, scheduler
from app.jobs.email import EmailJob
from app.routes.api_cron import SCHEDULE
from app.routes.api_events import events_part
from app.routes.api_jobs import jobs_part
from app.services import console_series
from mega.web import (
    UserDep,
    api_responses,
    instance_rows,
    ok,
    scheduler_instances,
    short_instance,
    tick_rows,
)

router = APIRouter(prefix="/api/demo")
logger = logging.getLogger("mega.demo")
# Instances seen in this many recent ticks count as alive.
RECENT_TICKS = 10
# Ticks read for the lateness chart: 20 scheduled ticks fit the window at one per 30 s, and
# each tick is one audit record per scheduler instance.
SERIES_TICKS = 60


async def schedules_part(request: Request) -> dict[str, Any]:
    """The schedulers seen in the audit and its newest ticks, as the admin pages show them
    (mega.web's helpers, and its table macros in templates/demo/console.html)."""
    ticks = await scheduler(request).recent_ticks(SCHEDULE, limit=RECENT_TICKS)
    return {
        "instances": instance_rows(scheduler_instances(ticks)),
        "ticks": tick_rows(ticks[:5]),
    }


async def workers_part(request: Request) -> dict[str, Any]:
    """The EmailJob workers running now: the framework's records of its consume loops (each
    writes one every 5 s), as the admin pages list them; a stopped one is left out."""
    seen = await queue(request).workers(EmailJob)
    return {
        "instances": [
            {
                "instance": loop.worker,
                "short": short_instance(loop.worker),
                "last_seen": datetime.fromtimestamp(loop.seen_at / 1000, UTC).isoformat(),
                "running": loop.running,
                "done": loop.done,
            }
            for loop in seen
            if loop.stopped_at is None
        ]
    }


async def pool_part(request: Request) -> dict[str, Any]:
    stats: dict[str, Any] = hash_pool(request).stats()
    return stats


async def series_part(request: Request) -> dict[str, Any]:
    """The charts' last 10 minutes; samples the DLQ size first (see console_series)."""
    redis = main_redis(request)
    stats = await queue(request).stats(EmailJob)
    await console_series.record_dlq_size(redis, stats.dlq)
    ticks = await scheduler(request).recent_ticks(SCHEDULE, limit=SERIES_TICKS)
    return await console_series.read_series(redis, ticks)


# Each console panel: name -> reader.
PARTS: dict[str, Callable[[Request], Awaitable[dict[str, Any]]]] = {
    "schedules": schedules_part,
    "jobs": jobs_part,
    "workers": workers_part,
    "events": events_part,
    "pool": pool_part,
    "series": series_part,
}


async def console_state(request: Request) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name, read in PARTS.items():
        try:
            data[name] = {"ok": True, **await read(request)}
        except Exception as exc:  # one panel down must not take the console with it
            logger.warning("console panel %s unavailable: %s", name, exc)
            data[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return data


@router.get("/console", responses=api_responses(errors=(401, 503)))
async def console(request: Request, user: UserDep) -> Response:
    return ok(await console_state(request))
