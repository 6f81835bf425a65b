"""JobWorker: the job-consumer host's runtime, one consume loop per registered Job.

Not to be confused with `Worker` (a CPU pool): a JobWorker runs the jobs of its bus, on any driver.

    worker = JobWorker(ctx)
    worker.register(EmailJob)           # validated here, against the context's buses
    worker.on("dlq", alert)
    await worker.start()                # streams/consumers ensured, loops running
    ...
    await worker.stop(timeout_s=30)     # stop pulling, finish in-flight jobs, hand back the rest

It keeps one JobQueue per bus alias and re-sends every signal of its queues, so one observer
sees the whole host: dispatch, start, progress (when a job reports it), done, retry, fail (with
`phase`), dlq.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mega.context import Context
from mega.errors import JobError
from mega.jobs.job import Job, JobSpec, validate_job
from mega.jobs.queue import SIGNALS, JobQueue
from mega.signals import Observer, Signals

logger = logging.getLogger("mega.jobworker")


class JobWorker:
    """Consume every registered Job class of this process.

    `instance_id` names the process in DLQ records (default: the context's); `apply_limits`
    lets the classes' limits change running consumers (see `ensure_consumer`).
    """

    def __init__(
        self, ctx: Context, *, instance_id: str | None = None, apply_limits: bool = False
    ) -> None:
        self.ctx = ctx
        self.instance_id = instance_id or ctx.instance_id
        self.apply_limits = apply_limits
        self.signals = Signals(SIGNALS)
        self.queues: dict[str, JobQueue] = {}
        self._specs: list[JobSpec] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._forwarded: set[tuple[str, str]] = set()

    def on(self, name: str, observer: Observer) -> None:
        """Observe a signal of any queue; unknown names raise ValueError."""
        self.signals.on(name, observer)
        for queue in self.queues.values():
            self._forward(queue, name)

    def register(self, job_cls: type[Job]) -> JobSpec:
        """Validate a Job class (RegistrationError names the field) and add it; before start()."""
        if self._tasks:
            raise JobError("register() jobs before start()", code="job.worker_started")
        spec = validate_job(job_cls, self.ctx.buses)
        if any(known.job_cls is job_cls for known in self._specs):
            raise JobError(f"{spec.name} is registered twice", code="job.twice")
        self._specs.append(spec)
        return spec

    def queue(self, bus_alias: str) -> JobQueue:
        """The queue of a bus alias (made on first use), sharing this worker's observers."""
        queue = self.queues.get(bus_alias)
        if queue is None:
            queue = JobQueue(
                self.ctx, bus_alias, instance_id=self.instance_id, apply_limits=self.apply_limits
            )
            self.queues[bus_alias] = queue
            for name in SIGNALS:
                if self.signals.has_observers(name):
                    self._forward(queue, name)
        return queue

    async def start(self) -> None:
        """Ensure every job's streams and consumer, then run one consume loop per job.

        Returns once all loops run. Raises DependencyUnavailable if NATS cannot be reached."""
        for spec in self._specs:
            await self.queue(spec.bus).ensure(spec.job_cls)
        for spec in self._specs:
            task = asyncio.create_task(
                self.queue(spec.bus).consume(spec.job_cls), name=f"mega-job-{spec.name}"
            )
            task.add_done_callback(self._loop_ended)
            self._tasks.append(task)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop pulling, wait up to `timeout_s` s for in-flight jobs, then hand the rest back
        to NATS for redelivery. Safe to call twice."""
        await asyncio.gather(*(queue.stop(timeout_s) for queue in self.queues.values()))
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks.clear()

    def _forward(self, queue: JobQueue, name: str) -> None:
        # Forward only signals someone observes: a queue skips building signals nobody hears,
        # which matters at thousands of jobs per second.
        if (queue.bus_alias, name) in self._forwarded:
            return
        self._forwarded.add((queue.bus_alias, name))

        async def forward(signal: dict[str, Any]) -> None:
            fields = {key: value for key, value in signal.items() if key != "signal"}
            await self.signals.emit(name, **fields)

        queue.on(name, forward)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("consume loop %s ended", task.get_name(), exc_info=task.exception())
