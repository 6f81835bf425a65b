"""What a workflow is and what it reports, as records: the status a user reads (WorkflowStatus,
its steps and outcomes), the steps a user makes (`Job.step`), the ids of its steps, and the
definition kept on the bus. How the steps' ends make a workflow go on is mega/jobs/steps.py;
what a user writes (`chain`, `group`), mega/jobs/workflow.py.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from mega import clock
from mega.drivers.base import Lane, Priority
from mega.errors import JobError
from mega.jobs.spec import JobBase, JobId, JobSpec
from mega.lanes.records import ErrorInfo
from mega.validation import MAX_ID_LENGTH

if TYPE_CHECKING:
    pass

logger = logging.getLogger("mega.jobqueue")

STEP_PREFIX = "wf~"  # a step's job id: wf~<workflow id>~<n>, the callback's wf~<workflow id>~then
THEN = "then"
# How long a workflow's records live after their last write (its definition: after its start).
WORKFLOW_KEEP_S = 7 * 24 * 3600.0
# The most members a group may have (its definition is one record).
MAX_MEMBERS = 10_000
# A member reads the other members' outcomes this many at a time, the last ones first: one
# that is missing (the usual case, for all but the last member to end) ends the read early.
READ_CHUNK = 100
# The workflow id leaves room in a job id for its prefix and the step's place.
MAX_WORKFLOW_ID_LENGTH = MAX_ID_LENGTH - len(STEP_PREFIX) - 6
# Definitions read by this process (they never change once written).
DEFINITIONS_CACHED = 1024

# The lane whose records hold every workflow of a bus (no job is ever stored on it).
WORKFLOWS = Lane(
    kind="job",
    name="mega.workflows",
    subject="_mega.workflows",
    concurrency=1,
    ack_wait_s=30.0,
    dlq_max_age_s=WORKFLOW_KEEP_S,
    keep_status_s=WORKFLOW_KEEP_S,
)

Ended = Literal["done", "dlq", "cancelled"]
WorkflowState = Literal["running", "done", "failed"]
UNSET: Any = object()
# Job classes this process declared, by subject: how a step's class is found first (a class
# made in a function cannot be imported by its path).
_CLASSES: dict[str, type[JobBase]] = {}


class Outcome(BaseModel):
    """How a group member ended, as its callback receives it: `state` "done" (with what `run`
    returned, when it was JSON), "dlq" or "cancelled" (with the last `error`, if any)."""

    model_config = ConfigDict(frozen=True)

    id: str
    job: str
    state: Ended
    result: Any = None
    error: ErrorInfo | None = None


class WorkflowStep(BaseModel):
    """One step of a workflow now: `state` is its outcome once it ended (done, dlq,
    cancelled), else its job's status (queued, delayed, running, retrying, failed) or
    `waiting` (not enqueued yet: a later step of a chain, a callback)."""

    model_config = ConfigDict(frozen=True)

    id: str
    job: str
    state: str
    attempts: int = 0
    result: Any = None
    error: ErrorInfo | None = None
    finished_at: int | None = None


class WorkflowStatus(BaseModel):
    """A workflow now. `state`: `running`; `done` (a chain's last step, a group's callback, or
    every member of a group without one, done); `failed` (a chain stopped at a step that
    ended in the DLQ or was cancelled; a callback that did; a group without one where a member
    did). `steps`: the chain's steps or the group's members, in order; `then`: the callback."""

    model_config = ConfigDict(frozen=True)

    id: str
    kind: Literal["chain", "group"]
    state: WorkflowState
    steps: tuple[WorkflowStep, ...]
    then: WorkflowStep | None = None
    created_at: int
    finished_at: int | None = None

    @property
    def final(self) -> bool:
        return self.state != "running"


class WorkflowId(JobId):
    """What a workflow's `enqueue` answers: its id, a plain `str`; `duplicate` is True when a
    workflow with this id was there already (nothing new was stored)."""

    __slots__ = ()


@dataclass(frozen=True)
class Step:
    """One job of a workflow, as `Job.step(payload, key=, priority=)` makes it (no payload: a
    chain step receives the previous step's result; a callback, the outcomes alone). `key`
    and `priority` are its job's, as `Job.enqueue` takes them: a tenant's steps keep its
    fair turns and its per-key limit."""

    job: type[JobBase]
    payload: Any = UNSET
    key: str | None = None
    priority: Priority | None = None

    @property
    def given(self) -> bool:
        return self.payload is not UNSET


def step_id(workflow_id: str, place: int | str) -> str:
    return f"{STEP_PREFIX}{workflow_id}~{place}"


def parse_step(job_id: str) -> tuple[str, int | str] | None:
    """(workflow id, place) of a step's job id, None for any other id."""
    if not job_id.startswith(STEP_PREFIX):
        return None
    workflow_id, _, place = job_id[len(STEP_PREFIX) :].rpartition("~")
    if not workflow_id:
        return None
    if place == THEN:
        return workflow_id, THEN
    return (workflow_id, int(place)) if place.isdigit() else None


def outcome_key(workflow_id: str, place: int | str) -> str:
    return f"{workflow_id} step {place}"


def sent_key(workflow_id: str, place: int | str) -> str:
    return f"{workflow_id} sent {place}"


# -- the records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDef:
    job: str
    subject: str
    path: str
    payload: Any = UNSET
    key: str | None = None
    priority: Priority | None = None

    def as_json(self) -> dict[str, Any]:
        found = {"job": self.job, "subject": self.subject, "path": self.path}
        if self.payload is not UNSET:
            found["payload"] = self.payload
        if self.key is not None:
            found["key"] = self.key
        if self.priority is not None:
            found["priority"] = self.priority
        return found

    @classmethod
    def made(cls, spec: JobSpec, step: Step, kind: str) -> StepDef:
        """The definition of `step` (of `spec`'s job) in a workflow of `kind`."""
        payload = step.payload if kind == "chain" else UNSET  # a member's is in its message
        return cls(spec.name, spec.subject, step_path(step.job), payload, step.key, step.priority)

    @classmethod
    def of(cls, raw: dict[str, Any]) -> StepDef:
        return cls(
            raw["job"],
            raw["subject"],
            raw["path"],
            raw.get("payload", UNSET),
            raw.get("key"),
            raw.get("priority"),
        )


@dataclass(frozen=True)
class Definition:
    """What a workflow is, as its first record keeps it: a chain's steps (with the payloads
    given), a group's members (their jobs; their payloads travel in their messages) and its
    callback."""

    id: str
    kind: Literal["chain", "group"]
    steps: tuple[StepDef, ...]
    then: StepDef | None
    created_at: int

    def encode(self) -> bytes:
        record: dict[str, Any] = {"kind": self.kind, "created_at": self.created_at}
        if self.kind == "group":  # one entry per distinct job, an index per member
            jobs = list(dict.fromkeys(self.steps))
            record["jobs"] = [s.as_json() for s in jobs]
            record["members"] = [jobs.index(s) for s in self.steps]
        else:
            record["steps"] = [s.as_json() for s in self.steps]
        if self.then is not None:
            record["then"] = self.then.as_json()
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, workflow_id: str, raw: bytes) -> Definition:
        record = json.loads(raw)
        if record["kind"] == "group":
            jobs = [StepDef.of(j) for j in record["jobs"]]
            steps = tuple(jobs[n] for n in record["members"])
        else:
            steps = tuple(StepDef.of(s) for s in record["steps"])
        then = StepDef.of(record["then"]) if "then" in record else None
        return cls(workflow_id, record["kind"], steps, then, record["created_at"])

    def at(self, place: int | str) -> StepDef | None:
        if place == THEN:
            return self.then
        assert isinstance(place, int)
        return self.steps[place] if place < len(self.steps) else None


def step_path(job: type[JobBase]) -> str:
    return f"{job.__module__}:{job.__qualname__}"


def remember(spec: JobSpec) -> None:
    """A job class this process declared (a JobQueue validated it): a workflow's step of it is
    found by its subject (`job_class`)."""
    _CLASSES[spec.subject] = spec.job_cls


def job_class(step: StepDef) -> type[JobBase]:
    """The class of a stored step: one this process declared (its JobQueue validated it, as
    `mega worker` does every job of its config), or imported by its path (and on the same
    subject). JobError `workflow.unknown_job` when neither finds it."""
    found = _CLASSES.get(step.subject)
    if found is not None:
        return found
    module, _, qualname = step.path.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        target = None
    if not isinstance(target, type) or getattr(target, "subject", None) != step.subject:
        raise JobError(
            f"cannot find job {step.job} (subject {step.subject}) of a workflow in this "
            f"process: {step.path} does not import as it; declare it at a module's top level",
            code="workflow.unknown_job",
        )
    _CLASSES[step.subject] = target
    return target


def outcome_record(
    state: Ended, result: Any, error: ErrorInfo | None, attempts: int, job_id: str
) -> bytes:
    record: dict[str, Any] = {"state": state, "attempts": attempts, "at": clock.now_ms()}
    if error is not None:
        record["error"] = error.model_dump()
    if result is not None:
        try:
            record["result"] = json.loads(json.dumps(result, allow_nan=False))
        except (TypeError, ValueError) as exc:
            logger.warning("%s returned a value that is not JSON (%s): not kept", job_id, exc)
    return json.dumps(record, separators=(",", ":")).encode()


def outcome_step(job_id: str, target: StepDef, raw: bytes) -> WorkflowStep:
    record = json.loads(raw)
    return WorkflowStep(
        id=job_id,
        job=target.job,
        state=record["state"],
        attempts=record["attempts"],
        result=record.get("result"),
        error=record.get("error"),
        finished_at=record["at"],
    )


def _state(
    definition: Definition, steps: list[WorkflowStep], then: WorkflowStep | None
) -> WorkflowState:
    ended = ("done", "dlq", "cancelled")
    failed = any(s.state in ("dlq", "cancelled") for s in steps)
    if definition.kind == "chain":
        if failed:
            return "failed"
        return "done" if steps[-1].state == "done" else "running"
    if then is not None:
        if then.state == "done":
            return "done"
        return "failed" if then.state in ("dlq", "cancelled") else "running"
    if all(s.state in ended for s in steps):
        return "failed" if failed else "done"
    return "running"


def workflow_status(
    definition: Definition, steps: list[WorkflowStep], then: WorkflowStep | None
) -> WorkflowStatus:
    """The status of a workflow from its definition and its steps' (and callback's) now."""
    state = _state(definition, steps, then)
    finished = None
    if state != "running":
        ends = (s.finished_at or 0 for s in (*steps, *([then] if then else [])))
        finished = max(ends, default=0) or None
    return WorkflowStatus(
        id=definition.id,
        kind=definition.kind,
        state=state,
        steps=tuple(steps),
        then=then,
        created_at=definition.created_at,
        finished_at=finished,
    )
