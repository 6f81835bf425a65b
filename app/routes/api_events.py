"""The events demo: a signup form whose commit emits UserSignedUp through the outbox, the
outbox itself (pending rows, relay lag, the pause switch), each event with every listener
group's status, the welcome credits one group writes, and the listener groups' dead letters
with requeue.

Bad input is a 422 with field errors and writes nothing. The JSON routes and the forms (post,
redirect, get: they work without JavaScript) share the functions below. Times are ISO-8601 in
one zone, UTC (`timezone` in the state), so the page labels its zone once.

Each event's `listeners` maps every group to its status: `waiting` while the event's row is
still in the outbox (nothing is published, so no group can have it yet), then `queued` until the
group starts it, and `running`, `retrying`, `done` or `dlq` as the group's worker reports.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.deps import BUS, database
from app.deps import event_bus as bus
from app.deps import main_redis as redis
from app.events import relay_switch, status
from app.events.listeners import LISTENERS
from app.events.signups import UserSignedUp
from app.jobs.signup import ActivateAccountJob, activation_id
from app.routes.api_jobs import ID_OR_ALL, Requeued
from app.services.signups import SignupService
from mega import Listener, outbox
from mega.web import (
    ApiError,
    CurrentUser,
    EmailAddress,
    OperatorDep,
    UserDep,
    api_responses,
    audited,
    field_errors,
    flash,
    job_queue,
    ok,
    render,
)

router = APIRouter()
GROUPS: dict[str, type[Listener]] = {listener.group: listener for listener in LISTENERS}
# Dead letters listed per group (the count covers all of them).
DLQ_LISTED = 10
# The page's one time zone.
ZONE = "UTC"


def unheard(pending: bool) -> str:
    """A group that has not reported on an event: it waits for the relay to publish it, or the
    event is on the bus and queued for the group."""
    return "waiting" if pending else "queued"


def utc_iso(moment: datetime | int) -> str:
    """A datetime (naive ones are UTC: SQLite keeps no zone) or epoch ms, as ISO-8601 UTC."""
    if isinstance(moment, int):
        moment = datetime.fromtimestamp(moment / 1000, UTC)
    elif moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds")


class SignupRequest(BaseModel):
    email: EmailAddress
    mode: Literal["ok", "rollback"] = "ok"


class RelayRequest(BaseModel):
    paused: Annotated[bool, Field(strict=True)]


class GroupRequeueRequest(BaseModel):
    group: Literal[
        "WelcomeEmailListener", "SignupStatsListener", "WelcomeCreditListener", "CrmSyncListener"
    ]
    id: Annotated[str | None, Field(min_length=1, max_length=100)] = None
    all: bool = False
    # What the validator below checks, said in the schema too (OpenAPI clients and fuzzers
    # then send only what is accepted): an id, or all: true, not both.
    model_config = ConfigDict(json_schema_extra=ID_OR_ALL)

    @model_validator(mode="after")
    def one_of(self) -> GroupRequeueRequest:
        if (self.id is None) == (not self.all):
            raise ValueError("give either an id or all: true")
        return self


async def sign_up(request: Request, body: SignupRequest) -> dict[str, Any]:
    result = await SignupService(database(request)).sign_up(str(body.email), body.mode)
    return {
        "committed": result.committed,
        "signup_id": result.signup_id,
        "event_id": result.event_id,
    }


async def events_state(request: Request) -> dict[str, Any]:
    db = database(request)
    signups = await SignupService(db).recent()
    ids = [signup.event_id for signup in signups]
    pending = await db.run(lambda session: outbox.pending_ids(session, ids))
    stats = await db.run(outbox.stats)
    heard = await status.statuses(redis(request), ids)
    jobs = await activations(request, ids, pending)
    listeners, dead = [], []
    for group, listener in GROUPS.items():
        dlq = bus(request).dlq
        count = await dlq.count(listener)
        listeners.append(
            {
                "group": group,
                "event": UserSignedUp.name,
                **await status.group_counts(redis(request), group),
                "dlq": count,
            }
        )
        if count:
            for record in await dlq.list(listener, limit=DLQ_LISTED):
                dead.append(
                    {
                        "group": group,
                        "id": record["id"],
                        "email": (record.get("payload") or {}).get("email"),
                        "error": f"{record['error']['type']}: {record['error']['message']}",
                        "attempts": record["attempts"],
                        "failed_at": utc_iso(record["failed_at"]),
                    }
                )
    return {
        "outbox": {
            "pending": stats.pending,
            "published": stats.published,
            "lag_ms": stats.lag_ms,
            "paused": await relay_switch.is_paused(redis(request)),
        },
        "events": [
            {
                "id": signup.event_id,
                "name": UserSignedUp.name,
                "email": signup.email,
                "signup_id": signup.id,
                "at": utc_iso(signup.created_at),
                "status": "pending" if signup.event_id in pending else "published",
                "listeners": {
                    g: heard[signup.event_id].get(g) or unheard(signup.event_id in pending)
                    for g in GROUPS
                },
                "job": jobs[signup.event_id],
            }
            for signup in signups
        ],
        "listeners": listeners,
        "credits": {"rows": await SignupService(db).credit_rows()},
        "dlq": dead,
        "timezone": ZONE,
    }


async def activations(
    request: Request, event_ids: list[str], pending: set[str]
) -> dict[str, dict[str, str]]:
    """Each signup's own job (ActivateAccountJob, written with `outbox.enqueue`): its id and
    state, from its status record; "waiting" while its row waits for the relay, as the
    event's."""
    queue = job_queue(request.app, BUS)
    ids = [activation_id(event_id) for event_id in event_ids]
    found = await asyncio.gather(*(queue.status(ActivateAccountJob, job_id) for job_id in ids))
    return {
        event_id: {
            "id": job_id,
            "name": ActivateAccountJob.__name__,
            "state": record.state if record else ("waiting" if event_id in pending else "queued"),
        }
        for event_id, job_id, record in zip(event_ids, ids, found, strict=True)
    }


async def requeue(request: Request, body: GroupRequeueRequest) -> int:
    dlq = bus(request).dlq
    listener = GROUPS[body.group]
    if body.all:
        return await dlq.requeue_all(listener)
    assert body.id is not None
    return await dlq.requeue(listener, body.id)


class SignupResult(BaseModel):
    committed: bool
    signup_id: int | None
    event_id: str | None


class RelayState(BaseModel):
    paused: bool


SIGNUP_ERRORS = (401, 403, 422, 503)


@router.get("/api/demo/events", responses=api_responses(errors=(401, 503)))
async def get_events(request: Request, user: UserDep) -> Response:
    return ok(await events_state(request))


@router.post(
    "/api/demo/events/signup",
    status_code=201,
    responses={
        **api_responses(SignupResult, status=201, errors=SIGNUP_ERRORS),
        **api_responses(SignupResult),  # a rollback: committed is false
    },
)
async def post_signup(body: SignupRequest, request: Request, user: UserDep) -> Response:
    result = await sign_up(request, body)
    return ok(result, status=201 if result["committed"] else 200)


@router.post(
    "/api/demo/events/relay", responses=api_responses(RelayState, errors=(401, 403, 422, 503))
)
async def post_relay(body: RelayRequest, request: Request, user: UserDep) -> Response:
    await relay_switch.set_paused(redis(request), body.paused)
    return ok({"paused": body.paused})


@router.post(
    "/api/demo/events/dlq/requeue",
    responses=api_responses(Requeued, errors=(401, 403, 404, 422, 503)),
)
async def post_requeue(body: GroupRequeueRequest, request: Request, user: OperatorDep) -> Response:
    """Requeue a group's dead letter, or all: an operator's action (403 for a viewer)."""
    count = await requeue(request, body)
    await audited_requeue(request, user, body, count)
    if body.id is not None and count == 0:
        raise ApiError(404, "not_found", f"no dead letter with id {body.id!r} in {body.group}")
    return ok({"requeued": count})


async def events_page_context(
    request: Request, *, form: dict[str, str] | None = None, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "title": "Events",
        "state": await events_state(request),
        "form": form or {"email": "grace@example.com", "mode": "ok"},
        "errors": errors or {},
    }


# ---- the page's forms without JavaScript: post, redirect, get --------------------------------


@router.post("/demo/events", include_in_schema=False)
async def signup_form(request: Request, user: UserDep) -> Response:
    form = await request.form()
    values = {"email": str(form.get("email", "")), "mode": str(form.get("mode", "ok"))}
    try:
        body = SignupRequest.model_validate(values)
    except ValidationError as exc:
        context = await events_page_context(request, form=values, errors=field_errors(exc.errors()))
        return render(request, "demo/events.html", context, status_code=422)
    result = await sign_up(request, body)
    notice = (
        f"Signup {result['signup_id']} committed; event {result['event_id']} is in the outbox."
        if result["committed"]
        else "Rolled back: no signup, no event."
    )
    return flash(request, RedirectResponse("/demo/events", status_code=303), notice)


@router.post("/demo/events/relay", include_in_schema=False)
async def relay_form(request: Request, user: UserDep) -> Response:
    form = await request.form()
    await relay_switch.set_paused(redis(request), form.get("paused") == "true")
    return RedirectResponse("/demo/events", status_code=303)


@router.post("/demo/events/dlq/requeue", include_in_schema=False)
async def requeue_form(request: Request, user: OperatorDep) -> Response:
    form = await request.form()
    try:
        body = GroupRequeueRequest.model_validate(
            {"group": form.get("group"), "id": form.get("id") or None, "all": not form.get("id")}
        )
    except ValidationError:
        back = RedirectResponse("/demo/events", status_code=303)
        return flash(request, back, "Unknown listener group.")
    count = await requeue(request, body)
    await audited_requeue(request, user, body, count)
    back = RedirectResponse("/demo/events", status_code=303)
    return flash(request, back, f"Requeued {count} event(s).")


async def audited_requeue(
    request: Request, user: CurrentUser, body: GroupRequeueRequest, count: int
) -> None:
    action = "requeue all" if body.all else "requeue"
    ids = [body.id] if body.id else []
    await audited(request, user, action, f"group:{body.group}", ids, f"{count} event(s)")


async def events_part(request: Request) -> dict[str, Any]:
    """The console's events panel: the outbox and each listener group."""
    db = database(request)
    stats = await db.run(outbox.stats)
    groups = []
    for group, listener in GROUPS.items():
        backlog = await bus(request).stats(listener)
        groups.append({"group": group, "pending": backlog.pending, "dlq": backlog.dlq})
    return {
        "outbox_pending": stats.pending,
        "lag_ms": stats.lag_ms,
        "paused": await relay_switch.is_paused(redis(request)),
        "groups": groups,
    }
