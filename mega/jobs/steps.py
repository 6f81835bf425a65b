"""Workflows above the drivers: the steps' ends and what follows them (records and status
models: workflow_records.py; what a user writes, the rules: workflow.py).

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

import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from mega import clock
from mega.drivers.base import DriverUnavailable, Lane
from mega.errors import JobError
from mega.jobs.spec import JobBase, JobSpec, encode_job
from mega.jobs.workflow_records import (
    MAX_WORKFLOW_ID_LENGTH,
    READ_CHUNK,
    STEP_PREFIX,
    THEN,
    UNSET,
    WORKFLOWS,
    Definition,
    Ended,
    Outcome,
    Step,
    StepDef,
    WorkflowId,
    WorkflowStatus,
    WorkflowStep,
    job_class,
    outcome_key,
    outcome_record,
    outcome_step,
    parse_step,
    sent_key,
    step_id,
    workflow_status,
)
from mega.lanes.records import FINAL, ErrorInfo, decode
from mega.validation import is_token

if TYPE_CHECKING:
    from mega.drivers.base import Bus, Message
    from mega.errors import DependencyUnavailable


logger = logging.getLogger("mega.jobqueue")

DEFINITIONS_CACHED = 1024  # definitions read by this process (they never change once written)


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
        now_ms = clock.now_ms()
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
            tuple(StepDef.made(specs[s.job], s, kind) for s in steps),
            None if then is None else StepDef.made(specs[then.job], then, "chain"),
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
            workflow_id, place, outcome_record(state, result, error, attempts, job_id)
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
                definition.id, place, outcome_record("dlq", None, error, 0, job_id)
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
        return workflow_status(definition, steps, then)

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
            steps.append(outcome_step(job_id, target, raw))
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
                    outcome_step(job_id, target, raw)
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
