"""What a JobQueue answers and steers of the jobs already enqueued: `JobSteering`, its base
class, reads a job's status record and result, cancels one job, and pauses and resumes a
job's queue for the whole fleet, on whichever driver the queue's bus names.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, overload

from mega.drivers.base import DriverUnavailable, Lane
from mega.errors import JobError, JobFailed
from mega.jobs.spec import JobBase, JobSpec, job_lane
from mega.jobs.workflow_records import WorkflowStatus
from mega.lanes import control
from mega.lanes.control import Cancelled, Pause
from mega.lanes.endpoint import LaneEndpoint
from mega.lanes.records import RESULT_POLL_S, JobStatus, read_status

if TYPE_CHECKING:
    from mega.jobs.steps import Workflows

logger = logging.getLogger("mega.jobqueue")


class JobSteering(LaneEndpoint):
    """The status, result, cancel and pause of a JobQueue's jobs (see the module). What it
    needs of the queue: `ensure` (the Job class validated, its queue set up) and
    `workflows`."""

    @property
    def workflows(self) -> Workflows:
        raise NotImplementedError  # JobQueue's

    async def ensure(self, job_cls: type[JobBase], *, force: bool = False) -> JobSpec:
        raise NotImplementedError  # JobQueue's

    # -- status and results -------------------------------------------------------------------

    @overload
    async def status(self, job_cls: type[JobBase], job_id: str) -> JobStatus | None: ...
    @overload
    async def status(self, job_cls: str, job_id: None = None) -> WorkflowStatus | None: ...

    async def status(
        self, job_cls: type[JobBase] | str, job_id: str | None = None
    ) -> JobStatus | WorkflowStatus | None:
        """The job's status record, or None when there is none (an unknown id, or one whose
        record is older than the job's `keep_status_s`). DependencyUnavailable when the bus
        does not answer.

        Args:
            job_cls: the Job class; or, alone, a workflow's id: then the answer is that
                workflow's status (mega/jobs/steps.py), or None for an unknown or expired id.
            job_id: the job's id, as `enqueue` returned it (None with a workflow's id).
        """
        if isinstance(job_cls, str):
            try:
                return await self.workflows.status(job_cls)
            except DriverUnavailable as exc:
                raise self.unavailable(f"cannot read workflow {job_cls}", exc) from exc
        assert job_id is not None, "status(Job, job_id) or status(workflow_id)"
        spec = await self.ensure(job_cls)
        try:
            return await read_status(self.bus, job_lane(spec), job_id)
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot read the status of {spec.name} {job_id}", exc) from exc

    async def result(
        self, job_cls: type[JobBase], job_id: str, *, timeout_s: float | None = None
    ) -> Any:
        """What the job's `run` returned, once it is done. JobFailed when it ended without one
        (`job.dead_lettered`, `job.cancelled`); JobError `job.result_not_kept` at once for a
        job whose `keep_result_s` is 0, and `job.result_gone` when the job is done and its
        result expired (or its value was not JSON).

        Args:
            job_cls: the Job class, on this queue's bus.
            job_id: the job's id, as `enqueue` returned it.
            timeout_s: how long to wait for the job to end, in seconds, then TimeoutError
                (None, the default: no limit).
        """
        spec = await self.ensure(job_cls)
        if spec.keep_result_s <= 0:
            raise JobError(
                f"{spec.name} keeps no results: set keep_result_s (seconds) on the class",
                code="job.result_not_kept",
            )
        async with asyncio.timeout(timeout_s):
            status = await self.status(job_cls, job_id)
            while status is None or not status.final:
                await asyncio.sleep(RESULT_POLL_S)
                status = await self.status(job_cls, job_id)
        if status.state != "done":
            error = f": {status.error.type}: {status.error.message}" if status.error else ""
            code = "job.cancelled" if status.state == "cancelled" else "job.dead_lettered"
            raise JobFailed(
                f"{spec.name} {job_id} ended {status.state}{error}", code=code, status=status
            )
        try:
            [raw] = await self.bus.get_records(job_lane(spec), "result", [job_id])
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot read the result of {spec.name} {job_id}", exc) from exc
        if raw is None:
            raise JobError(
                f"{spec.name} {job_id} is done and its result is gone (kept {spec.keep_result_s:g}"
                " s, and only when `run` returns a JSON value)",
                code="job.result_gone",
            )
        return json.loads(raw)

    # -- control ------------------------------------------------------------------------------

    async def cancel(self, job_cls: type[JobBase], job_id: str) -> Cancelled:
        """Cancel one job. Queued, delayed or retrying: it never runs (again). Running: its
        worker cancels its task within a second (`run` gets CancelledError at its next
        `await`) and nothing retries it. Finished: nothing changes, and the answer says so
        (`cancelled` False, `state` done, dlq or cancelled). JobError `job.no_status` for a
        job whose `keep_status_s` is 0 (the cancel is a status record).

        Args:
            job_cls: the Job class, on this queue's bus.
            job_id: the job's id, as `enqueue` returned it.
        """
        spec = await self.ensure(job_cls)
        lane = self._recorded(spec, "cancel")
        try:
            return await control.cancel(self.bus, lane, spec.name, job_id)
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot cancel {spec.name} {job_id}", exc) from exc

    async def pause(self, job_cls: type[JobBase], *, by: str = "") -> Pause:
        """Pause the job's queue for the whole fleet: within a second no worker starts one,
        and the running ones finish. Enqueueing goes on.

        Args:
            job_cls: the Job class, on this queue's bus.
            by: who pauses it, for the record and the log (default empty).
        """
        return await self._set_pause(job_cls, paused=True, by=by)

    async def resume(self, job_cls: type[JobBase], *, by: str = "") -> Pause:
        """Undo `pause`: within a second the workers start the job's queue again.

        Args:
            job_cls: the Job class, on this queue's bus.
            by: who resumes it, for the record and the log (default empty).
        """
        return await self._set_pause(job_cls, paused=False, by=by)

    async def paused(self, job_cls: type[JobBase]) -> Pause:
        """Whether the job's queue is paused, since when and by whom.

        Args:
            job_cls: the Job class, on this queue's bus.
        """
        spec = await self.ensure(job_cls)
        try:
            return await control.read_pause(self.bus, job_lane(spec))
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot read whether {spec.name} is paused", exc) from exc

    async def _set_pause(self, job_cls: type[JobBase], *, paused: bool, by: str) -> Pause:
        spec = await self.ensure(job_cls)
        lane = self._recorded(spec, "pause" if paused else "resume")
        try:
            record = await control.set_pause(self.bus, lane, paused=paused, by=by)
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot pause or resume {spec.name}", exc) from exc
        logger.info("%s %s by %s", spec.name, "paused" if paused else "resumed", by or "?")
        return record

    def _recorded(self, spec: JobSpec, what: str) -> Lane:
        """The job's lane, which must keep status records for `what` to work."""
        if spec.keep_status_s <= 0:
            raise JobError(
                f"cannot {what} {spec.name}: it keeps no status records (keep_status_s = 0)",
                code="job.no_status",
            )
        return job_lane(spec)
