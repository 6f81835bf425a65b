"""The admin pages' actions (mega/web/admin/routes.py): a lane's dead letters (browse, the whole
record, retry, delete, purge after a confirm step) and a schedule's pause, resume and run.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from mega.errors import ConfigError, JobError
from mega.web.admin import fleet, job_views
from mega.web.admin.console import (
    PAGE_SIZE,
    Admin,
    BeforeQuery,
    IdForm,
    IdQuery,
    Lane,
)
from mega.web.auth import AdminDep, OperatorDep, UserDep, audited

# -- dead letters -------------------------------------------------------------------------------


async def dlq_page(lane: Lane, before: int | None) -> tuple[list[Any], int | None]:
    """One page of dead letters, newest first, and the `before` of the next (older) page."""
    records = await lane.dlq.list(lane.cls, limit=PAGE_SIZE + 1, before=before)
    older = records[PAGE_SIZE - 1]["seq"] if len(records) > PAGE_SIZE else None
    return records[:PAGE_SIZE], older


def add_dlq_routes(router: APIRouter, admin: Admin, kind: str, path: str) -> None:
    @router.get(path, name=f"admin_{kind}_dlq")
    async def browse(
        request: Request, user: UserDep, name: str, before: BeforeQuery = None
    ) -> Response:
        lane = admin.lane(request, kind, name)
        records, older = await dlq_page(lane, before)
        count = await lane.dlq.count(lane.cls)
        return admin.page(
            request,
            "dlq.html",
            title=f"Dead letters of {lane.name}",
            lane=lane,
            count=count,
            records=[job_views.dead_letter_view(r) for r in records],
            before=before,
            older_url=admin.dlq_url(lane, before=older) if older else None,
            newest_url=admin.dlq_url(lane) if before else None,
            dlq_url=admin.dlq_url(lane),
        )

    @router.get(path + "/record", name=f"admin_{kind}_dlq_record")
    async def whole_record(request: Request, user: UserDep, name: str, id: IdQuery) -> Response:
        """One dead letter, whole, as JSON: what a page shows cut (over 16 KB)."""
        lane = admin.lane(request, kind, name)
        record = await lane.dlq.get(lane.cls, id)
        if record is None:
            raise HTTPException(404, f"no dead letter {id} of {lane.name}")
        return JSONResponse(record)

    @router.post(path + "/retry", name=f"admin_{kind}_dlq_retry")
    async def retry(request: Request, user: OperatorDep, name: str, id: IdForm) -> Response:
        lane = admin.lane(request, kind, name)
        try:
            moved = await lane.dlq.requeue(lane.cls, id)
        except JobError as exc:
            return admin.done(request, admin.dlq_url(lane), exc.message)
        if moved:
            await audited(request, user, "retry", f"{lane.kind}:{lane.name}", [id])
        text = (
            f"Dead letter {id} requeued: it runs again, attempts counted from 1."
            if moved
            else f"No dead letter {id}: it was requeued, deleted or expired."
        )
        return admin.done(request, admin.dlq_url(lane), text)

    @router.post(path + "/delete", name=f"admin_{kind}_dlq_delete")
    async def delete(request: Request, user: AdminDep, name: str, id: IdForm) -> Response:
        lane = admin.lane(request, kind, name)
        gone = await lane.dlq.delete(lane.cls, id)
        if gone:
            await audited(request, user, "delete", f"{lane.kind}:{lane.name}", [id])
        text = f"Dead letter {id} deleted." if gone else f"No dead letter {id}: already gone."
        return admin.done(request, admin.dlq_url(lane), text)

    @router.get(path + "/purge", name=f"admin_{kind}_dlq_purge_confirm")
    async def confirm_purge(request: Request, user: AdminDep, name: str) -> Response:
        lane = admin.lane(request, kind, name)
        count = await lane.dlq.count(lane.cls)
        return admin.page(
            request,
            "purge.html",
            title=f"Purge the dead letters of {lane.name}",
            lane=lane,
            count=count,
            dlq_url=admin.dlq_url(lane),
        )

    @router.post(path + "/purge", name=f"admin_{kind}_dlq_purge")
    async def purge(request: Request, user: AdminDep, name: str) -> Response:
        lane = admin.lane(request, kind, name)
        count = await lane.dlq.purge(lane.cls)
        word = "dead letter" if count == 1 else "dead letters"
        await audited(request, user, "purge", f"{lane.kind}:{lane.name}", detail=f"{count} {word}")
        return admin.done(request, admin.dlq_url(lane), f"Purged {count} {word} of {lane.name}.")


# -- schedules ---------------------------------------------------------------------------------


def add_schedule_route(router: APIRouter, admin: Admin, action: str) -> None:
    @router.post(f"/schedules/{{name}}/{action}", name=f"admin_schedule_{action}")
    async def change(request: Request, user: OperatorDep, name: str) -> Response:
        scheduler = admin.scheduler(request)
        if name not in scheduler.names:
            raise HTTPException(404, f"no schedule named {name!r} is registered")
        target = admin.url("/") + "#schedules"
        await audited(request, user, "run now" if action == "run" else action, f"schedule:{name}")
        if action == "run":
            result = await scheduler.run_now(name)
            if not result.ran:
                text = f"{name}: manual tick skipped: {result.reason}."
            elif result.error:
                text = f"{name}: manual tick ran and failed: {result.error}"
            else:
                text = f"{name}: manual tick ran."
            return admin.done(request, target, text)
        try:
            change = scheduler.pause if action == "pause" else scheduler.resume
            record = await change(name, by=user.username)
        except ConfigError as exc:
            return admin.done(request, target, f"{name}: {exc.message}")
        state = fleet.pause_text(record.paused, record.at_ms, record.by)
        return admin.done(request, target, f"{name}: {state}.")
