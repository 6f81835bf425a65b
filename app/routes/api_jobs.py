"""The EmailJob demo: enqueue (JSON and form), the timeline and DLQ state, and DLQ requeue.

Bad input is a 422 with field errors and enqueues nothing. NATS down: 503 naming it.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    EmailStr,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.jobs.email import SLOW_ACK_WAITS, SLOW_STEPS, EmailJob
from app.services import job_timeline
from mega import JobQueue
from mega.web import ApiError, UserDep, api_responses, field_errors, flash, ok, render

router = APIRouter()
# How many dead letters the page lists (the count covers all of them).
DLQ_LISTED = 20

# An e-mail address (email-validator, through pydantic): no CR, LF, NUL or bidi override can
# ride along into a log line or a header.
Recipient = Annotated[EmailStr, Field(max_length=254)]


# The longest delay the page offers, in ms (SPEC 4.2).
MAX_DELAY_MS = 60_000

# Paging the timeline: `before` is a job id (the page's are 12 hex digits, a welcome job's a
# "w" and 11), `limit` how many jobs, at most every one kept.
Before = Annotated[
    str | None,
    Query(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="list the jobs older than this job id"),
]
Limit = Annotated[
    int,
    Query(ge=1, le=job_timeline.MAX_JOBS, description="jobs to list, newest first (1 to 30)"),
]


class EnqueueRequest(BaseModel):
    to: Recipient
    mode: Literal["ok", "flaky", "fail", "slow", "crash"] = "ok"
    # Hold the job this long before it may run (a broker-side schedule: it takes no slot).
    delay_ms: Annotated[
        int, Field(ge=0, le=MAX_DELAY_MS, description="ms before the job may run (0 to 60000)")
    ] = 0

    @field_validator("delay_ms", mode="before")
    @classmethod
    def whole_ms(cls, value: Any) -> Any:
        # One sentence for every way to get it wrong ("5", 1.5, true, -1, 60001).
        if type(value) is not int or not 0 <= value <= MAX_DELAY_MS:
            raise ValueError(f"must be a whole number of milliseconds from 0 to {MAX_DELAY_MS}")
        return value


ID_OR_ALL: dict[str, Any] = {
    "oneOf": [
        {"required": ["id"], "properties": {"id": {"type": "string"}, "all": {"const": False}}},
        {"required": ["all"], "properties": {"all": {"const": True}, "id": {"type": "null"}}},
    ]
}


class RequeueRequest(BaseModel):
    id: Annotated[str | None, Field(min_length=1, max_length=100)] = None
    all: bool = False
    # What the validator below checks, said in the schema too (OpenAPI clients and fuzzers
    # then send only what is accepted): an id, or all: true, not both.
    model_config = ConfigDict(json_schema_extra=ID_OR_ALL)

    @model_validator(mode="after")
    def one_of(self) -> RequeueRequest:
        if (self.id is None) == (not self.all):
            raise ValueError("give either an id or all: true")
        return self


def queue(request: Request) -> JobQueue:
    """The web app's JobQueue on bus `jobs` (it only enqueues and reads; it never consumes)."""
    found: JobQueue = request.app.state.job_queue
    return found


def redis(request: Request) -> Any:
    return request.app.state.ctx.cache("main").native


async def enqueue_email(request: Request, body: EnqueueRequest) -> str:
    job_id = uuid.uuid4().hex[:12]
    await job_timeline.record_enqueued(
        redis(request), job_id, body.to, body.mode, delay_ms=body.delay_ms
    )
    try:
        # The page's id is the job id: it is also the dedup key (Nats-Msg-Id).
        await queue(request).enqueue(
            EmailJob, {"id": job_id, "to": body.to, "mode": body.mode}, id=job_id,
            delay=body.delay_ms / 1000 or None,
        )  # fmt: skip
    except BaseException:
        await job_timeline.forget(redis(request), job_id)
        raise
    return job_id


async def jobs_state(
    request: Request, *, limit: int = job_timeline.MAX_JOBS, before: str | None = None
) -> dict[str, Any]:
    """`jobs` newest first (`limit` of them, older than job `before` if given), `older` (the
    `before` of the next page, or None), and the DLQ."""
    dlq = queue(request).dlq
    records = await dlq.list(EmailJob, limit=DLQ_LISTED)
    listed = await job_timeline.list_jobs(redis(request), limit, before=before)
    return {
        "jobs": listed.jobs,
        "older": listed.older,
        "dlq": {
            "count": await dlq.count(EmailJob),
            "items": [
                {
                    "id": r["id"],
                    "to": (r.get("payload") or {}).get("to"),
                    "error": f"{r['error']['type']}: {r['error']['message']}",
                    "attempts": r["attempts"],
                    "failed_at": r["failed_at"],
                }
                for r in records
            ],
        },
    }


async def requeue(request: Request, body: RequeueRequest) -> int:
    """Put dead letters back on the queue. Their timelines say "requeued" and their attempt
    counters restart *before* the requeue: a worker may start one the instant it is back, and
    its "attempt 1 started" must come after, counted from 1."""
    dlq = queue(request).dlq
    listed = [r["id"] for r in await dlq.list(EmailJob, limit=10_000)]
    ids = listed if body.all else [job_id for job_id in listed if job_id == body.id]
    for job_id in ids:
        await redis(request).delete(job_timeline.attempts_key(job_id))
        await job_timeline.record_event(
            redis(request), job_id, "requeued", "requeued from the DLQ, attempts reset",
            status="queued", attempt=0, due=job_timeline.Due(job_timeline.now_ms(), "requeue"),
        )  # fmt: skip
    if not ids:
        return 0
    if body.all:
        return await dlq.requeue_all(EmailJob)
    assert body.id is not None
    return await dlq.requeue(EmailJob, body.id)


class JobCreated(BaseModel):
    id: str


class Requeued(BaseModel):
    requeued: int


@router.get("/api/demo/jobs", responses=api_responses(errors=(401, 422, 503)))
async def get_jobs(
    request: Request, user: UserDep, before: Before = None, limit: Limit = job_timeline.MAX_JOBS
) -> Response:
    """Every kept job (the newest 30) by default; `limit` and `before` page through them:
    `?limit=10`, then `?limit=10&before=<older>` with the `older` of the previous answer."""
    return ok(await jobs_state(request, limit=limit, before=before))


@router.post(
    "/api/demo/jobs", status_code=201,
    responses=api_responses(JobCreated, status=201, errors=(401, 403, 422, 503)),
)  # fmt: skip
async def post_job(body: EnqueueRequest, request: Request, user: UserDep) -> Response:
    return ok({"id": await enqueue_email(request, body)}, status=201)


@router.post(
    "/api/demo/jobs/dlq/requeue",
    responses=api_responses(Requeued, errors=(401, 403, 404, 422, 503)),
)
async def post_requeue(body: RequeueRequest, request: Request, user: UserDep) -> Response:
    count = await requeue(request, body)
    if body.id is not None and count == 0:
        raise ApiError(404, "not_found", f"no dead letter with id {body.id!r}")
    return ok({"requeued": count})


async def jobs_page_context(
    request: Request,
    *,
    form: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    before: str | None = None,
) -> dict[str, Any]:
    """What /demo/jobs renders: the state (a page of the newest jobs, or of those older than
    `before`), the form (kept on a 422) and its field errors."""
    return {
        "title": "Jobs",
        "state": await jobs_state(request, limit=job_timeline.PAGE_JOBS, before=before),
        "page_jobs": job_timeline.PAGE_JOBS,
        "before": before,
        "max_jobs": job_timeline.MAX_JOBS,
        "form": form or {"to": "ada@example.com", "mode": "flaky"},
        "errors": errors or {},
        "job": EmailJob,
        "slow_steps": SLOW_STEPS,
        "slow_ack_waits": SLOW_ACK_WAITS,
        "max_delay_ms": MAX_DELAY_MS,
    }


# ---- the page's forms without JavaScript: post, redirect, get --------------------------------


@router.post("/demo/jobs", include_in_schema=False)
async def post_job_form(request: Request, user: UserDep) -> Response:
    form = await request.form()
    try:
        values: dict[str, Any] = {k: form.get(k) for k in ("to", "mode") if form.get(k)}
        delay = str(form.get("delay_ms") or "0").strip()
        # Digits become an int for the model to judge (a long run of them stays text: int()
        # refuses thousands of digits, and no delay needs more than five).
        whole = delay.isascii() and delay.isdigit() and len(delay) <= 9
        values["delay_ms"] = int(delay) if whole else delay
        body = EnqueueRequest.model_validate(values)
    except ValidationError as exc:
        form_values = {
            "to": str(form.get("to", "")), "mode": str(form.get("mode", "ok")),
            "delay_ms": str(form.get("delay_ms", "0")),
        }  # fmt: skip
        context = await jobs_page_context(
            request, form=form_values, errors=field_errors(exc.errors())
        )
        return render(request, "demo/jobs.html", context, status_code=422)
    job_id = await enqueue_email(request, body)
    return flash(
        request, RedirectResponse("/demo/jobs", status_code=303), f"Job {job_id} enqueued."
    )


@router.post("/demo/jobs/dlq/requeue", include_in_schema=False)
async def requeue_form(request: Request, user: UserDep) -> Response:
    form = await request.form()
    job_id = form.get("id")
    body = RequeueRequest(id=str(job_id)) if job_id else RequeueRequest(all=True)
    count = await requeue(request, body)
    back = RedirectResponse("/demo/jobs", status_code=303)
    return flash(request, back, f"Requeued {count} job(s) from the DLQ.")


async def jobs_part(request: Request) -> dict[str, Any]:
    """The console's job panel: waiting, in flight, DLQ, enqueue-to-start p50."""
    stats = await queue(request).stats(EmailJob)
    return {
        "pending": stats.pending,
        "in_flight": stats.in_flight,
        "dlq": stats.dlq,
        "start_latency_p50_ms": await job_timeline.latency_p50_ms(redis(request)),
    }
