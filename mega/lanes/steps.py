"""The stage of a workflow's steps (mega/lanes/stages.py): `StepReports` tells a workflow that
one of its steps ended, before the step's delivery is settled and before its status record
says `done` or `cancelled` (mega/lanes/recorded.py, the stage around it, writes those at the
ack). A worker killed in between leaves a step that runs (and reports) again, never a step
settled or recorded `done` whose workflow was not told: a redelivery of a job whose record
says `done` is acked unrun.

A step whose workflow cannot be told that it ended (done, cancelled) is handed back to run and
report again after `delay_s`, through every stage of its lane (its status record's stage then
stores this run's records first, as for any hand-back). A dead-lettered one's report goes with
its dead letter, after its record says `failed`: if either fails, both are tried again
(mega/lanes/executor.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, Literal, Protocol

from mega.drivers.base import DriverUnavailable
from mega.lanes.records import ErrorInfo
from mega.lanes.stages import End, SettleNext

logger = logging.getLogger("mega.jobqueue")


class StepEnds(Protocol):
    """Where a job lane reports the end of a workflow step (mega/jobs/steps.py's Workflows),
    before its delivery is settled. Its steps' job ids start with `id_prefix`."""

    id_prefix: str

    async def ended(
        self,
        job_id: str,
        state: Literal["done", "dlq", "cancelled"],
        *,
        result: Any = None,
        error: ErrorInfo | None = None,
        attempts: int = 1,
    ) -> None: ...


class StepReports:
    """The stage that reports each step's end to its workflow (see the module). `name` is
    the job's, in the log line of a report that failed."""

    def __init__(self, steps: StepEnds, *, name: str, delay_s: float) -> None:
        self.steps = steps
        self.name = name
        self.delay_s = delay_s
        self.head: SettleNext | None = None

    def chained(self, head: SettleNext) -> None:
        """Keep the head of the lane's chain of stages, to hand a step back through all of
        them (mega/lanes/stages.py)."""
        self.head = head

    def settle(self, end: End, call_next: SettleNext) -> Awaitable[None]:
        if not end.delivery.id.startswith(self.steps.id_prefix) or end.kind in ("retry", "back"):
            return call_next(end)  # no step's end: nothing to wait for here
        return self._reported_first(end, call_next)

    async def _reported_first(self, end: End, call_next: SettleNext) -> None:
        job_id, kind = end.delivery.id, end.kind
        if kind == "dead":  # its failure goes out with the dead letter's: both are tried again
            await self.steps.ended(job_id, "dlq", error=end.error, attempts=end.attempts)
            await call_next(end)
            return
        state: Literal["done", "cancelled"] = "done" if kind == "done" else "cancelled"
        try:
            await self.steps.ended(job_id, state, result=end.result, attempts=end.delivery.attempt)
        except DriverUnavailable as exc:
            logger.warning(
                "%s: %s ended %s, and its workflow could not be told (%s): it runs again in %g s",
                self.name,
                job_id,
                state,
                exc,
                self.delay_s,
            )
            await (self.head or call_next)(end.handed_back(self.delay_s))
            return
        await call_next(end)
