"""Workflows above the drivers: their records, the steps' ends, their status. What a user
writes (`chain`, `group`) is in mega/jobs/workflow.py, which says the rules; this is how they
hold.

How it holds under crashes. Each step is a job whose id names its workflow and its place
(`wf~<workflow id>~<n>`, the callback's `wf~<workflow id>~then`). The consume loop reports a
step's end here before it settles the delivery (`Workflows.ended`): so a worker that dies
before the report has its step delivered again, and one that dies after it loses nothing.
What is reported lives in the bus's workflow records (`Bus.put_records` on the lane
WORKFLOWS): the workflow's definition, and each step's outcome, stored once (`create`: the first
report of a step wins, a rerun's is dropped). After storing its outcome, a member reads every
member's: the one that finds them all enqueues the callback. Two that finish together may both
find them; the callback's id is the workflow's, so the bus's dedup window (2 minutes) drops
the second copy, and a `sent` record, written once the callback is stored and read before
each enqueue, keeps out any later one. A chain's next step is enqueued the same way, from the
outcome stored (not from a rerun's), so every step runs on what its predecessor recorded.
One later report does replace an outcome: a `done` over a `dlq`, from a step an operator
requeued from the DLQ that then succeeded, so a chain stopped there goes on.

A workflow's records are kept WORKFLOW_KEEP_S after their last write: a workflow must end
within it. All its steps live on one bus.
"""

from __future__ import annotations

import importlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from mega import clock
from mega.drivers.base import DriverUnavailable, Lane, Priority
from mega.errors import JobError
from mega.jobs.spec import JobBase, JobId, JobSpec, encode_job
from mega.lanes.status import FINAL, ErrorInfo, decode
from mega.validation import MAX_ID_LENGTH, is_token

if TYPE_CHECKING:
    from mega.drivers.base import Bus, Message
    from mega.errors import DependencyUnavailable

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


def _path(job: type[JobBase]) -> str:
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


def _outcome_record(
    state: Ended, result: Any, error: ErrorInfo | None, attempts: int, job_id: str
) -> bytes:
    record: dict[str, Any] = {"state": state, "attempts": attempts, "at": _now_ms()}
    if error is not None:
        record["error"] = error.model_dump()
    if result is not None:
        try:
            record["result"] = json.loads(json.dumps(result, allow_nan=False))
        except (TypeError, ValueError) as exc:
            logger.warning("%s returned a value that is not JSON (%s): not kept", job_id, exc)
    return json.dumps(record, separators=(",", ":")).encode()


# -- one bus's workflows ----------------------------------------------------------------------


class Queue(Protocol):
    """What the workflows of a bus need of its JobQueue."""

    bus: Bus

    async def ensure(self, job_cls: type[JobBase], *, force: bool = False) -> JobSpec: ...
    def lane(self, job_cls: type[JobBase]) -> Lane: ...
    async def _enqueue_encoded(self, job_cls: type[JobBase], messages: list[Message]) -> None: ...
    def unavailable(self, what: str, exc: DriverUnavailable) -> DependencyUnavailable: ...


class Workflows:
    """The workflows of one JobQueue's bus: `start` stores one, `ended` is the consume loop's
    report of a step's end, `status` reads one."""

    id_prefix = STEP_PREFIX  # a job whose id starts so is a step: the consume loop reports it

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.bus = queue.bus
        self._ready = False
        self._definitions: OrderedDict[str, Definition] = OrderedDict()

    async def _ensure(self) -> None:
        if not self._ready:
            await self.bus.ensure(WORKFLOWS, apply_limits=False)
            self._ready = True

    # -- start --------------------------------------------------------------------------------

    async def start(
        self,
        kind: Literal["chain", "group"],
        steps: tuple[Step, ...],
        then: Step | None,
        workflow_id: str | None,
    ) -> WorkflowId:
        """Check every step, store the definition (unless a workflow with this id exists),
        then the first step (a chain's) or every member (a group's)."""
        if workflow_id is None:
            workflow_id = uuid.uuid4().hex
        elif not is_token(workflow_id, MAX_WORKFLOW_ID_LENGTH):
            raise JobError(
                f"a workflow id must be 1-{MAX_WORKFLOW_ID_LENGTH} printable characters "
                f"without spaces, got {workflow_id!r}",
                code="workflow.invalid_id",
            )
        every = (*steps, *((then,) if then is not None else ()))
        specs = {s.job: await self.queue.ensure(s.job) for s in every}
        if then is not None and then.given and not isinstance(then.payload, dict):
            raise JobError(
                f"{specs[then.job].name}: a callback's payload must be a dict (its outcomes are "
                f"added under 'outcomes'), got {type(then.payload).__name__}",
                code="workflow.invalid_step",
            )
        first = steps[:1] if kind == "chain" else steps
        now_ms = _now_ms()
        messages = [
            (
                s.job,
                encode_job(
                    specs[s.job],
                    None if not s.given else s.payload,
                    job_id=step_id(workflow_id, n),
                    now_ms=now_ms,
                    key=s.key,
                    priority=s.priority,
                ),
            )
            for n, s in enumerate(first)
        ]
        for n, s in enumerate(steps[1:] if kind == "chain" else (), start=1):
            if s.given:  # checked now, as the first step's was
                encode_job(
                    specs[s.job],
                    s.payload,
                    job_id=step_id(workflow_id, n),
                    key=s.key,
                    priority=s.priority,
                )
        definition = Definition(
            workflow_id,
            kind,
            tuple(self._step_def(specs[s.job], s, kind) for s in steps),
            None if then is None else self._step_def(specs[then.job], then, "chain"),
            now_ms,
        )
        try:
            await self._ensure()
            [created] = await self.bus.put_records(
                WORKFLOWS, "status", [(workflow_id, definition.encode())], create=True
            )
        except DriverUnavailable as exc:
            raise self.queue.unavailable(f"cannot store workflow {workflow_id}", exc) from exc
        if not created:
            return WorkflowId(workflow_id, duplicate=True)
        by_job: dict[type[JobBase], list[Any]] = {}
        for job, message in messages:
            by_job.setdefault(job, []).append(message)
        for job, batch in by_job.items():
            await self.queue._enqueue_encoded(job, batch)
        return WorkflowId(workflow_id)

    @staticmethod
    def _step_def(spec: JobSpec, step: Step, kind: str) -> StepDef:
        payload = step.payload if kind == "chain" else UNSET  # a member's is in its message
        return StepDef(spec.name, spec.subject, _path(step.job), payload, step.key, step.priority)

    # -- the consume loop's reports -----------------------------------------------------------

    async def ended(
        self,
        job_id: str,
        state: Ended,
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        attempts: int = 1,
    ) -> None:
        """A step's end, before its delivery is settled: store its outcome (the first report
        wins), then enqueue what follows it. DriverUnavailable when the bus does not answer
        (the delivery is then handed back to report again)."""
        parsed = parse_step(job_id)
        if parsed is None:
            return
        workflow_id, place = parsed
        definition = await self._definition(workflow_id)
        if definition is None or definition.at(place) is None:
            logger.warning(
                "%s looks like a workflow step, but workflow %s has no such step (expired, or "
                "not a workflow): it ran as a plain job",
                job_id,
                workflow_id,
            )
            return
        outcome = await self._store_outcome(
            workflow_id, place, _outcome_record(state, result, error, attempts, job_id)
        )
        if place == THEN:
            return
        assert isinstance(place, int)
        if definition.kind == "chain":
            if outcome["state"] == "done" and place + 1 < len(definition.steps):
                nxt = definition.steps[place + 1]
                payload = nxt.payload if nxt.payload is not UNSET else outcome.get("result")
                await self._send(definition, place + 1, payload)
            return
        if definition.then is not None:
            outcomes = await self._all_ended(definition)
            if outcomes is not None:
                given = definition.then.payload
                payload = {**(given if isinstance(given, dict) else {}), "outcomes": outcomes}
                await self._send(definition, THEN, payload)

    async def _definition(self, workflow_id: str) -> Definition | None:
        cached = self._definitions.get(workflow_id)
        if cached is not None:
            return cached
        await self._ensure()
        [raw] = await self.bus.get_records(WORKFLOWS, "status", [workflow_id])
        if raw is None:
            return None
        definition = Definition.decode(workflow_id, raw)
        self._definitions[workflow_id] = definition
        while len(self._definitions) > DEFINITIONS_CACHED:
            self._definitions.popitem(last=False)
        return definition

    async def _store_outcome(
        self, workflow_id: str, place: int | str, record: bytes
    ) -> dict[str, Any]:
        """Store a step's outcome unless one is stored; returns the one stored. A `done` does
        replace a `dlq`: the step was requeued from the DLQ and succeeded (a stopped chain then
        goes on; a group whose callback was sent keeps it as sent)."""
        key = outcome_key(workflow_id, place)
        found: dict[str, Any] = json.loads(record)
        [created] = await self.bus.put_records(WORKFLOWS, "status", [(key, record)], create=True)
        if created:
            return found
        [stored] = await self.bus.get_records(WORKFLOWS, "status", [key])
        if stored is None:
            return found
        kept: dict[str, Any] = json.loads(stored)
        if kept["state"] == "dlq" and found["state"] == "done":
            await self.bus.put_records(WORKFLOWS, "status", [(key, record)], create=False)
            return found
        return kept

    async def _all_ended(self, definition: Definition) -> list[dict[str, Any]] | None:
        """Every member's outcome, as its callback receives it, or None while one is missing
        (read the last members first, READ_CHUNK at a time)."""
        size = len(definition.steps)
        keys = [outcome_key(definition.id, n) for n in range(size)]
        found: list[bytes] = []
        for end in range(size, 0, -READ_CHUNK):
            start = max(0, end - READ_CHUNK)
            chunk = await self.bus.get_records(WORKFLOWS, "status", keys[start:end])
            if any(raw is None for raw in chunk):
                return None
            found[:0] = [raw for raw in chunk if raw is not None]
        outcomes = []
        for n, raw in enumerate(found):
            record = json.loads(raw)
            member = Outcome(
                id=step_id(definition.id, n),
                job=definition.steps[n].job,
                state=record["state"],
                result=record.get("result"),
                error=record.get("error"),
            )
            outcomes.append(member.model_dump(mode="json", exclude_none=True))
        return outcomes

    async def _send(self, definition: Definition, place: int | str, payload: Any) -> None:
        """Enqueue a chain's next step or a group's callback, unless it was sent already; a
        payload its job refuses (or a job this process cannot find) ends the step in the
        DLQ's stead, with that error, so the workflow fails rather than hangs."""
        sent = sent_key(definition.id, place)
        [marked] = await self.bus.get_records(WORKFLOWS, "status", [sent])
        if marked is not None:
            return
        target = definition.at(place)
        assert target is not None
        job_id = step_id(definition.id, place)
        try:
            job = job_class(target)
            spec = await self.queue.ensure(job)
            message = encode_job(
                spec, payload, job_id=job_id, key=target.key, priority=target.priority
            )
        except JobError as exc:
            logger.error("workflow %s: cannot enqueue %s: %s", definition.id, job_id, exc)
            error = ErrorInfo(type=type(exc).__name__, message=str(exc))
            await self._store_outcome(
                definition.id, place, _outcome_record("dlq", None, error, 0, job_id)
            )
            return
        await self.queue._enqueue_encoded(job, [message])
        await self.bus.put_records(WORKFLOWS, "status", [(sent, b"1")], create=True)

    # -- status -------------------------------------------------------------------------------

    async def status(self, workflow_id: str) -> WorkflowStatus | None:
        """The workflow now, or None for an unknown (or expired) id. DriverUnavailable when
        the bus does not answer."""
        definition = await self._definition(workflow_id)
        if definition is None:
            return None
        places: list[int | str] = [*range(len(definition.steps))]
        if definition.then is not None:
            places.append(THEN)
        raws = await self.bus.get_records(
            WORKFLOWS, "status", [outcome_key(workflow_id, p) for p in places]
        )
        steps = await self._steps(definition, places, raws)
        then = steps.pop() if definition.then is not None else None
        state = _state(definition, steps, then)
        finished = None
        if state != "running":
            finished = (
                max((s.finished_at or 0 for s in (*steps, *([then] if then else []))), default=0)
                or None
            )
        return WorkflowStatus(
            id=workflow_id,
            kind=definition.kind,
            state=state,
            steps=tuple(steps),
            then=then,
            created_at=definition.created_at,
            finished_at=finished,
        )

    async def _steps(
        self, definition: Definition, places: Sequence[int | str], raws: list[bytes | None]
    ) -> list[WorkflowStep]:
        """Each step: its outcome, else its job's status record, else `waiting`. A step stores
        its outcome before its job's record says it ended: one whose record says so while its
        outcome was missing ended between the two reads, and its outcome is read again (else
        it would read `done` without its result)."""
        steps: list[WorkflowStep | None] = []
        unended: dict[str, list[tuple[int, str]]] = {}  # subject -> (index, job id)
        for n, (place, raw) in enumerate(zip(places, raws, strict=True)):
            target = definition.at(place)
            assert target is not None
            job_id = step_id(definition.id, place)
            if raw is None:
                steps.append(None)
                unended.setdefault(target.subject, []).append((n, job_id))
                continue
            steps.append(_outcome_step(job_id, target, raw))
        for subject, pending in unended.items():
            target = next(
                s
                for s in (*definition.steps, definition.then)
                if s is not None and s.subject == subject
            )
            statuses = await self._job_statuses(target, [job_id for _, job_id in pending])
            ended = [
                n
                for (n, _), status in zip(pending, statuses, strict=True)
                if status is not None and status[0] in FINAL
            ]
            outcomes = (
                await self.bus.get_records(
                    WORKFLOWS, "status", [outcome_key(definition.id, places[n]) for n in ended]
                )
                if ended
                else []
            )
            late = dict(zip(ended, outcomes, strict=True))
            for (n, job_id), status in zip(pending, statuses, strict=True):
                raw = late.get(n)
                steps[n] = (
                    _outcome_step(job_id, target, raw)
                    if raw is not None
                    else WorkflowStep(
                        id=job_id,
                        job=target.job,
                        state="waiting" if status is None else status[0],
                        attempts=0 if status is None else status[1],
                    )
                )
        return [s for s in steps if s is not None]

    async def _job_statuses(
        self, target: StepDef, job_ids: list[str]
    ) -> list[tuple[str, int] | None]:
        """(state, attempts) of each job's status record, None where there is none (or its
        class is not in this process)."""
        try:
            lane = self.queue.lane(job_class(target))
        except JobError:
            return [None] * len(job_ids)
        if lane.keep_status_s <= 0:
            return [None] * len(job_ids)
        await self.queue.ensure(job_class(target))
        answers: list[tuple[str, int] | None] = []
        for raw in await self.bus.get_records(lane, "status", job_ids):
            status = None if raw is None else decode(raw)
            answers.append(None if status is None else (status.state, status.attempts))
        return answers


def _outcome_step(job_id: str, target: StepDef, raw: bytes) -> WorkflowStep:
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


def _now_ms() -> int:
    return clock.now_ms()
