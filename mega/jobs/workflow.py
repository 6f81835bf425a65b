"""Workflows: jobs that wait for each other.

    flow = chain(Fetch.step({"url": url}), Resize.step(), Publish.step())
    workflow_id = await flow.enqueue(ctx)           # Resize gets what Fetch returned

    fan = group([Resize.step({"size": s}) for s in (64, 128, 256)]).then(Publish.step({"album": 7}))
    workflow_id = await fan.enqueue(ctx, id="album-7")
    status = await queue.status(workflow_id)        # a WorkflowStatus: its steps' states

The rules:
- A chain runs its steps one after the other. A step given no payload receives the previous
  step's result as its payload; one given a payload gets that one. A step that ends in the
  DLQ (or is cancelled) stops the chain: the steps after it never run, unless that step is
  requeued from the DLQ and then succeeds: the chain goes on from there.
- A group runs its members at once. Its callback (`then`) runs once, after every member is
  done or dead-lettered (or cancelled), whatever their outcomes: its payload is
  `{"outcomes": [Outcome, ...]}` in member order (each with its `result` or `error`), beside
  the keys of the payload it was given (a dict).
- Every step of a workflow is on one bus; a workflow's id (given: its dedup key) names its
  steps' job ids, so a step's id is not given. How this holds when workers die is
  mega/jobs/steps.py's to say.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from mega.errors import JobError
from mega.jobs.queue import queue_of
from mega.jobs.workflow_records import MAX_MEMBERS, Step, WorkflowId

if TYPE_CHECKING:
    from mega.context import Context


@dataclass(frozen=True)
class Chain:
    """Steps run one after the other (see the module)."""

    steps: tuple[Step, ...]

    async def enqueue(self, ctx: Context, *, id: str | None = None) -> WorkflowId:
        """Store the workflow and its first step; returns its id.

        Args:
            ctx: the host's context, or a run's.
            id: the workflow's id (default a random one); given, it is the dedup key of the
                whole workflow: a second enqueue with it stores nothing, `.duplicate` True.
        """
        return await _start(ctx, "chain", self.steps, None, id)


@dataclass(frozen=True)
class Group:
    """Members run at once; `then(step)` adds the callback that runs once after them all."""

    members: tuple[Step, ...]
    callback: Step | None = field(default=None)

    def then(self, step: Step) -> Group:
        """This group with a callback, which runs once after every member has ended.

        Args:
            step: the callback, `SomeJob.step(payload)` or `SomeJob.step()` (JobError
                `workflow.invalid_step` otherwise); a payload given must be a dict, as its
                outcomes are added under "outcomes" (checked at enqueue).
        """
        if not isinstance(step, Step):
            raise JobError(
                "then() takes one step: SomeJob.step(payload) or SomeJob.step()",
                code="workflow.invalid_step",
            )
        return Group(self.members, step)

    async def enqueue(self, ctx: Context, *, id: str | None = None) -> WorkflowId:
        """Store the workflow and every member; returns its id.

        Args:
            ctx: the host's context, or a run's.
            id: the workflow's id and dedup key, as `Chain.enqueue` takes it.
        """
        return await _start(ctx, "group", self.members, self.callback, id)


def chain(*steps: Step) -> Chain:
    """A chain of steps: `chain(A.step(p), B.step(), C.step())` (see the module).

    Args:
        *steps: the steps in the order they run, each `SomeJob.step(...)`, all on one bus
            (checked at enqueue): 1 to 10,000 of them, else JobError `workflow.invalid_step`
            or `workflow.too_big`.
    """
    return Chain(_steps(steps, "chain"))


def group(members: Iterable[Step]) -> Group:
    """A group of members run at once: `group([A.step(p1), A.step(p2)]).then(C.step())`.

    Args:
        members: the steps run at once, each `SomeJob.step(...)`, all on one bus (checked at
            enqueue): 1 to 10,000 of them, else JobError `workflow.invalid_step` or
            `workflow.too_big`.
    """
    return Group(_steps(members, "group"))


def _steps(steps: Iterable[Step], what: str) -> tuple[Step, ...]:
    found = tuple(steps)
    if not found or not all(isinstance(s, Step) for s in found):
        raise JobError(
            f"a {what} takes one or more steps, each SomeJob.step(payload) or SomeJob.step()",
            code="workflow.invalid_step",
        )
    if len(found) > MAX_MEMBERS:
        raise JobError(
            f"a {what} takes at most {MAX_MEMBERS} steps, got {len(found)}: split it",
            code="workflow.too_big",
        )
    return found


async def _start(
    ctx: Context,
    kind: Literal["chain", "group"],
    steps: tuple[Step, ...],
    then: Step | None,
    workflow_id: str | None,
) -> WorkflowId:
    buses = {s.job.bus for s in (*steps, *([then] if then else []))}
    if len(buses) != 1:
        raise JobError(
            f"every step of a workflow must be on one bus; these are on {sorted(buses)}",
            code="workflow.mixed_buses",
        )
    queue = queue_of(ctx, buses.pop())
    return await queue.workflows.start(kind, steps, then, workflow_id)
