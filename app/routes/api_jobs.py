"""The EmailJob demo: enqueue (JSON and form, one job or `count` alike), the recent jobs (each
read from its status record) and the DLQ, one job's status with its result, cancel, and DLQ
requeue. And the noisy-neighbour demo: a flood of one tenant's jobs and a few of another's,
in order or fair, with each tenant's waits (app/services/noisy.py).

Bad input is a 422 with field errors and enqueues nothing. NATS down: 503 naming it.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.deps import QueueDep, RedisDep
from app.deps import main_redis as redis_of
from app.deps import queue as queue_of
from app.jobs.email import SLOW_ACK_WAITS, SLOW_STEPS, EmailJob
from app.jobs.tenant import LIMIT_PER_S
from app.services import console_series, noisy, recent_jobs
from app.services.job_card import CRASHED
from app.services.jobs_page import job_view, jobs_state
from app.services.pipeline import MAX_MEMBERS
from mega import JobQueue, JobStatus
from mega.web import (
    ApiError,
    CurrentUser,
    EmailAddress,
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
# The longest delay the page offers, in ms.
MAX_DELAY_MS = 60_000
# The most jobs one enqueue makes: more than the page keeps (recent_jobs.MAX_JOBS), so a
# queue visibly builds up behind EmailJob's slots.
MAX_COUNT = 50

# Paging the jobs: `before` is a job id (the page's are 12 hex digits, a welcome job's a
# "w" and 11), `limit` how many jobs, at most every one kept.
Before = Annotated[
    str | None,
    Query(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="list the jobs older than this job id"),
]
Limit = Annotated[
    int,
    Query(ge=1, le=recent_jobs.MAX_JOBS, description="jobs to list, newest first (1 to 30)"),
]


class EnqueueRequest(BaseModel):
    to: EmailAddress
    mode: Literal["ok", "flaky", "fail", "permanent", "slow", "crash"] = "ok"
    # Hold the job this long before it may run (a broker-side schedule: it takes no slot).
    delay_ms: Annotated[
        int,
        WholeNumber(0, MAX_DELAY_MS, unit="milliseconds"),
        Field(description="ms before the job may run (0 to 60000)"),
    ] = 0
    count: Annotated[
        int,
        WholeNumber(1, MAX_COUNT),
        Field(description="how many such jobs to enqueue at once (1 to 50)"),
    ] = 1


ID_OR_ALL: dict[str, Any] = {
    "oneOf": [
        {"required": ["id"], "properties": {"id": {"type": "string"}, "all": {"const": False}}},
        {"required": ["all"], "properties": {"all": {"const": True}, "id": {"type": "null"}}},
    ]
}


class RequeueRequest(BaseModel):
    id: Annotated[str | None, Field(min_length=1, max_length=100)] = None
    all: bool = False
    # With all: true, the dead letters of jobs that killed their worker too (WorkerCrashed):
    # each one requeued kills a worker again, up to its attempts. Left out unless asked for.
    crashed: bool = False
    # What the validator below checks, said in the schema too (OpenAPI clients and fuzzers
    # then send only what is accepted): an id, or all: true, not both.
    model_config = ConfigDict(json_schema_extra=ID_OR_ALL)

    @model_validator(mode="after")
    def one_of(self) -> RequeueRequest:
        if (self.id is None) == (not self.all):
            raise ValueError("give either an id or all: true")
        return self


async def enqueue_emails(queue: JobQueue, redis: Any, body: EnqueueRequest) -> list[str]:
    """`body.count` jobs alike, one after the other; their ids in order. If the bus fails part
    way (a 503), the jobs enqueued before stay enqueued: each is its own durable message."""
    return [await enqueue_email(queue, redis, body) for _ in range(body.count)]


async def enqueue_email(queue: JobQueue, redis: Any, body: EnqueueRequest) -> str:
    job_id = uuid.uuid4().hex[:12]
    await recent_jobs.remember(redis, job_id, body.to, body.mode)
    try:
        # The page's id is the job id: it is also the dedup key (Nats-Msg-Id).
        await queue.enqueue(
            EmailJob,
            {"id": job_id, "to": body.to, "mode": body.mode},
            id=job_id,
            delay=body.delay_ms / 1000 or None,
        )
    except BaseException:
        await recent_jobs.forget(redis, job_id)
        raise
    return job_id


async def audited_requeue(
    request: Request, user: CurrentUser, body: RequeueRequest, done: Requeued
) -> None:
    """The audit row of a requeue from the page (mega.web.audited)."""
    action = "requeue all" if body.all else "requeue"
    ids = [body.id] if body.id else []
    await audited(request, user, action, "job:EmailJob", ids, requeued_text(done))


def requeued_text(done: Requeued) -> str:
    """The page's sentence on a requeue."""
    text = f"Requeued {done.requeued} job(s) from the DLQ."
    if done.left_crashed:
        text += (
            f" Left {done.left_crashed} that killed their worker (WorkerCrashed): each would "
            "kill one again; tick the box to requeue those too."
        )
    return text


async def requeue(queue: JobQueue, redis: Any, body: RequeueRequest) -> Requeued:
    """Put dead letters back on the queue, attempts counted from 1 again; the page notes each
    requeue on its job's card. "All" leaves out the jobs that killed their worker unless
    `body.crashed` asks for them too, as `mega dlq requeue` asks for --all: a requeued crash
    job kills a worker again on each of its attempts."""
    dlq = queue.dlq
    listed = await dlq.list(EmailJob, limit=10_000)
    if body.all:
        crashed = [r["id"] for r in listed if r["error"]["type"] == CRASHED]
        ids = [r["id"] for r in listed if body.crashed or r["id"] not in crashed]
        left = 0 if body.crashed else len(crashed)
    else:
        ids, left = [r["id"] for r in listed if r["id"] == body.id], 0
    for job_id in ids:
        await recent_jobs.note_requeue(redis, job_id)
    if body.all and not left:
        return Requeued(requeued=await dlq.requeue_all(EmailJob))
    count = 0
    for job_id in dict.fromkeys(ids):  # once each, though a job may have several records
        count += await dlq.requeue(EmailJob, job_id)
    return Requeued(requeued=count, left_crashed=left)


class JobCreated(BaseModel):
    id: str  # the (first) job's id
    ids: list[str] | None = None  # every id, in order, when count is more than 1


class Requeued(BaseModel):
    requeued: int
    left_crashed: int = 0  # dead letters of jobs that killed their worker, not requeued


class CancelAnswer(BaseModel):
    cancelled: bool  # False: it had ended already, as `state` says
    state: str


JobIdPath = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="a job's id")]


@router.get(
    "/api/demo/jobs/{job_id}", responses=api_responses(JobStatus, errors=(401, 404, 422, 503))
)
async def get_job(job_id: JobIdPath, user: UserDep, queue: QueueDep) -> Response:
    """The job's status record (the framework's: state, attempts, times, worker, last error)
    with `result`, what its run returned, once it is done."""
    view = await job_view(queue, job_id)
    if view is None:
        raise ApiError(404, "not_found", f"no job with id {job_id!r} (kept a day)")
    return ok(view)


async def cancel(queue: JobQueue, job_id: str) -> CancelAnswer:
    """Cancel the job (ApiError 404 for an id with no record)."""
    if await queue.status(EmailJob, job_id) is None:
        raise ApiError(404, "not_found", f"no job with id {job_id!r} (kept a day)")
    answer = await queue.cancel(EmailJob, job_id)
    return CancelAnswer(cancelled=answer.cancelled, state=answer.state)


def cancel_text(job_id: str, answer: CancelAnswer) -> str:
    """The page's one-line account of a cancel."""
    if answer.cancelled:
        return f"Job {job_id} cancelled: it will not run again."
    return f"Job {job_id} was not cancelled: it had ended ({answer.state})."


@router.post(
    "/api/demo/jobs/{job_id}/cancel",
    responses=api_responses(CancelAnswer, errors=(401, 403, 404, 422, 503)),
)
async def cancel_job(
    request: Request, job_id: JobIdPath, user: OperatorDep, queue: QueueDep
) -> Response:
    """Cancel a queued, delayed or running job (a `slow` one mid-run); one that has ended
    answers `cancelled: false` with its state. An operator's action (403 for a viewer)."""
    answer = await cancel(queue, job_id)
    await audited(request, user, "cancel", "job:EmailJob", [job_id], answer_detail(answer))
    return ok(answer.model_dump())


def answer_detail(answer: CancelAnswer) -> str:
    return "cancelled" if answer.cancelled else f"not cancelled: {answer.state}"


@router.get("/api/demo/jobs", responses=api_responses(errors=(401, 422, 503)))
async def get_jobs(
    user: UserDep,
    queue: QueueDep,
    redis: RedisDep,
    before: Before = None,
    limit: Limit = recent_jobs.MAX_JOBS,
) -> Response:
    """Every kept job (the newest 30) by default; `limit` and `before` page through them:
    `?limit=10`, then `?limit=10&before=<older>` with the `older` of the previous answer."""
    return ok(await jobs_state(queue, redis, limit=limit, before=before))


@router.post(
    "/api/demo/jobs",
    status_code=201,
    responses=api_responses(JobCreated, status=201, errors=(401, 403, 422, 503)),
)
async def post_job(
    body: EnqueueRequest, user: UserDep, queue: QueueDep, redis: RedisDep
) -> Response:
    """Enqueue `count` jobs (default 1): `{id}`, and `ids` too when count is more than 1."""
    ids = await enqueue_emails(queue, redis, body)
    return ok({"id": ids[0], **({"ids": ids} if len(ids) > 1 else {})}, status=201)


class NoisyRequest(BaseModel):
    fair: bool = Field(description="the tenants' jobs take turns (False: first in, first out)")
    rate_limited: bool = Field(
        False, description=f"the fair job, capped at {LIMIT_PER_S} starts a second"
    )

    @property
    def mode(self) -> noisy.Mode:
        return "limited" if self.rate_limited else "fair" if self.fair else "in_order"


class NoisyRun(BaseModel):
    run: str


class TenantFigures(BaseModel):
    enqueued: int
    done: int
    wait_p50_ms: int | None  # None until one of its jobs started
    wait_p99_ms: int | None


class NoisyFigures(BaseModel):
    run: str
    mode: str  # in_order, fair or limited
    tenants: dict[str, TenantFigures]  # big and small
    starts_per_s: list[int]  # jobs started in each second since the first start


RunPath = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$", description="a noisy run's id")]


@router.post(
    "/api/demo/jobs/noisy",
    status_code=201,
    responses=api_responses(NoisyRun, status=201, errors=(401, 403, 422, 503)),
)
async def post_noisy(
    body: NoisyRequest, user: UserDep, queue: QueueDep, redis: RedisDep
) -> Response:
    """Tenant big enqueues 500 jobs (60 when rate-limited), then tenant small 5; `{run}`
    names them for GET."""
    return ok({"run": await noisy.start(queue, redis, body.mode)}, status=201)


@router.get(
    "/api/demo/jobs/noisy/{run}",
    responses=api_responses(NoisyFigures, errors=(401, 404, 422, 503)),
)
async def get_noisy(run: RunPath, user: UserDep, redis: RedisDep) -> Response:
    """Each tenant's jobs done so far and their waits (enqueue to start), p50 and p99 in ms."""
    found = await noisy.figures(redis, run)
    if found is None:
        raise ApiError(404, "not_found", f"no noisy-neighbour run {run!r} (kept an hour)")
    return ok(found)


@router.post(
    "/api/demo/jobs/dlq/requeue",
    responses=api_responses(Requeued, errors=(401, 403, 404, 422, 503)),
)
async def post_requeue(
    request: Request, body: RequeueRequest, user: OperatorDep, queue: QueueDep, redis: RedisDep
) -> Response:
    """Requeue one dead letter, or all: an operator's action (403 for a viewer)."""
    done = await requeue(queue, redis, body)
    await audited_requeue(request, user, body, done)
    if body.id is not None and done.requeued == 0:
        raise ApiError(404, "not_found", f"no dead letter with id {body.id!r}")
    return ok(done.model_dump())


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
        "state": await jobs_state(
            queue_of(request), redis_of(request), limit=recent_jobs.PAGE_JOBS, before=before
        ),
        "page_jobs": recent_jobs.PAGE_JOBS,
        "before": before,
        "max_jobs": recent_jobs.MAX_JOBS,
        "form": form or {"to": "ada@example.com", "mode": "flaky", "delay_ms": "0", "count": "1"},
        "errors": errors or {},
        "job": EmailJob,
        "slow_steps": SLOW_STEPS,
        "slow_ack_waits": SLOW_ACK_WAITS,
        "max_delay_ms": MAX_DELAY_MS,
        "max_count": MAX_COUNT,
        "noisy_limit": LIMIT_PER_S,
        "pipeline_max": MAX_MEMBERS,
    }


# ---- the page's forms without JavaScript: post, redirect, get --------------------------------


@router.post("/demo/jobs", include_in_schema=False)
async def post_job_form(
    request: Request, user: UserDep, queue: QueueDep, redis: RedisDep
) -> Response:
    form = await request.form()
    typed = {name: str(form.get(name, "")) for name in ("to", "mode", "delay_ms", "count")}
    values: dict[str, Any] = {k: typed[k] for k in ("to", "mode") if typed[k]}
    values["delay_ms"] = form_number(typed["delay_ms"] or "0")
    values["count"] = form_number(typed["count"] or "1")
    try:
        body = EnqueueRequest.model_validate(values)
    except ValidationError as exc:
        context = await jobs_page_context(request, form=typed, errors=field_errors(exc.errors()))
        return render(request, "demo/jobs.html", context, status_code=422)
    ids = await enqueue_emails(queue, redis, body)
    notice = f"Job {ids[0]} enqueued." if len(ids) == 1 else f"{len(ids)} jobs enqueued."
    return flash(request, RedirectResponse("/demo/jobs", status_code=303), notice)


@router.post("/demo/jobs/dlq/requeue", include_in_schema=False)
async def requeue_form(
    request: Request, user: OperatorDep, queue: QueueDep, redis: RedisDep
) -> Response:
    form = await request.form()
    job_id = form.get("id")
    crashed = form.get("crashed") == "include"
    body = RequeueRequest(id=str(job_id)) if job_id else RequeueRequest(all=True, crashed=crashed)
    done = await requeue(queue, redis, body)
    await audited_requeue(request, user, body, done)
    back = RedirectResponse("/demo/jobs", status_code=303)
    return flash(request, back, requeued_text(done))


@router.post("/demo/jobs/{job_id}/cancel", include_in_schema=False)
async def cancel_form(
    job_id: JobIdPath, request: Request, user: OperatorDep, queue: QueueDep
) -> Response:
    back = RedirectResponse("/demo/jobs", status_code=303)
    try:
        answer = await cancel(queue, job_id)
    except ApiError:
        notice = f"No job with id {job_id} is kept any more."
    else:
        notice = cancel_text(job_id, answer)
        await audited(request, user, "cancel", "job:EmailJob", [job_id], answer_detail(answer))
    return flash(request, back, notice)


async def jobs_part(request: Request) -> dict[str, Any]:
    """The console's job panel: waiting, in flight, DLQ, enqueue-to-start p50."""
    stats = await queue_of(request).stats(EmailJob)
    return {
        "pending": stats.pending,
        "in_flight": stats.in_flight,
        "dlq": stats.dlq,
        "start_latency_p50_ms": await console_series.start_latency_p50_ms(redis_of(request)),
    }
