"""The pipeline demo on /demo/jobs: a group of resize jobs, then one publish job with every
outcome (app/services/pipeline.py). `POST /api/demo/workflows` starts a run, `GET
/api/demo/workflows/{id}` says where it is. Bad input is a 422 with field errors and enqueues
nothing; the bus down, a 503 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field

from app.deps import QueueDep, RedisDep
from app.services import pipeline
from mega.web import ApiError, UserDep, WholeNumber, api_responses, context, ok

router = APIRouter()


class WorkflowRequest(BaseModel):
    members: Annotated[
        int,
        WholeNumber(1, pipeline.MAX_MEMBERS),
        Field(description=f"sizes to resize the photo to at once (1 to {pipeline.MAX_MEMBERS})"),
    ] = 5
    fail: bool = Field(False, description="the middle size fails (its job ends in the DLQ)")


class WorkflowCreated(BaseModel):
    id: str


class MemberState(BaseModel):
    size: int  # px
    state: str  # waiting, queued, running, retrying, done, dlq, cancelled
    attempts: int
    result: dict[str, Any] | None  # what the member returned, once done
    error: str | None  # why it ended in the DLQ


class CallbackState(BaseModel):
    state: str  # waiting until every member ended, then queued, running, done
    result: dict[str, Any] | None


class WorkflowRun(BaseModel):
    id: str
    state: str  # running, done or failed
    members: list[MemberState]
    callback: CallbackState
    callback_runs: int  # how many times the publish job ran: 0, then 1
    results: list[dict[str, Any]] | None  # the outcomes the publish job received


RunPath = Annotated[str, Path(pattern=r"^pl[0-9a-f]{10}$", description="a pipeline run's id")]


@router.post(
    "/api/demo/workflows",
    status_code=201,
    responses=api_responses(WorkflowCreated, status=201, errors=(401, 403, 422, 503)),
)
async def post_workflow(body: WorkflowRequest, user: UserDep, request: Request) -> Response:
    """Resize a photo to `members` sizes at once, then publish it once: `{id}` names the run."""
    workflow_id = await pipeline.start(context(request), body.members, body.fail)
    return ok({"id": workflow_id}, status=201)


@router.get(
    "/api/demo/workflows/{id}",
    responses=api_responses(WorkflowRun, errors=(401, 404, 422, 503)),
)
async def get_workflow(id: RunPath, user: UserDep, queue: QueueDep, redis: RedisDep) -> Response:
    """The run now: its state, each member's, the publish job's runs and what it received."""
    found = await pipeline.read(queue, redis, id)
    if found is None:
        raise ApiError(404, "not_found", f"no pipeline run {id!r} (kept a week)")
    return ok(found)
