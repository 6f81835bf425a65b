"""JobQueue: enqueue a job's messages and consume them, on whichever driver its bus names.

    queue = JobQueue(ctx, "jobs")
    job_id = await queue.enqueue(EmailJob, {"to": "ada@example.com"}, delay=30)
    await queue.consume(EmailJob)        # the consume loop, until stop()

(`await EmailJob.enqueue(ctx, payload)` is the short form: mega/jobs/job.py.)

The queue knows no engine: it validates the Job class, encodes the payload, and hands the
driver of its bus (`ctx.bus(alias)`, see mega/drivers) a `Lane` and `Message`s; consuming is
the one consume loop of consumer.py over the driver's `Receiver`. Every step is reported to
observers as a signal of SIGNALS.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from mega import clock, tracing
from mega.context import Context
from mega.deprecation import deprecated
from mega.drivers.base import (
    Bus,
    Delivery,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
    Priority,
)
from mega.errors import JobError
from mega.jobs.progress import RunContexts
from mega.jobs.spec import (
    JobBase,
    JobId,
    JobSpec,
    due_ms_of,
    encode_job,
    fit_schema,
    job_lane,
    validate_job,
)
from mega.jobs.steering import JobSteering
from mega.jobs.steps import Workflows
from mega.jobs.workflow_records import remember
from mega.lanes.control import LaneControl
from mega.lanes.declaration import check_engine_cap, threaded
from mega.lanes.dlq import DeadLetters
from mega.lanes.presence import WorkerSeen
from mega.lanes.records import created
from mega.lanes.status import StatusWriter

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

logger = logging.getLogger("mega.jobqueue")

# `enqueue(..., session=)`, deprecated: the outbox writes a job in the caller's transaction on
# every bus (mega/transactional/store.py).
SESSION_SPELLING = "enqueue(..., session=...)"
SESSION_INSTEAD = "outbox.enqueue(session, Job, payload) in the transaction, on any bus"
SIGNALS = ("dispatch", "start", "progress", "done", "retry", "fail", "dlq", "cancel")


class JobQueue(JobSteering):
    """Enqueue and consume the jobs of one bus alias; a Job does not change when its bus
    changes driver, and a `Context` built by hand works with every driver. Options and
    observers as LaneEndpoint's (mega/lanes/endpoint.py), with the signals of SIGNALS; what it
    answers and steers of the jobs enqueued (status, result, cancel, pause) is JobSteering's
    (mega/jobs/steering.py).
    """

    signal_names: ClassVar[tuple[str, ...]] = SIGNALS
    kind: ClassVar[str] = "job"

    def spec(self, job_cls: type[JobBase]) -> JobSpec:
        """The validated spec of a Job class on this queue's bus (cached).

        Args:
            job_cls: the Job class; RegistrationError names each bad attribute, and JobError
                `job.wrong_bus` says it is on another bus.
        """
        return self.declared(job_cls, self._validated)

    def _validated(self, job_cls: type[JobBase]) -> JobSpec:
        spec = validate_job(job_cls, self.ctx.buses)
        remember(spec)  # a workflow's step of it is found by its subject in this process
        return spec

    def lane(self, job_cls: type[JobBase]) -> Lane:
        """What the driver needs to know of the job's queue (its `Lane`).

        Args:
            job_cls: the Job class, on this queue's bus (validated as `spec` does).
        """
        return job_lane(self.spec(job_cls))

    @functools.cached_property
    def workflows(self) -> Workflows:
        """The workflows of this queue's bus (mega/jobs/steps.py)."""
        return Workflows(self)

    @property
    def dlq(self) -> DeadLetters:
        """DLQ tools (list, count, requeue, purge) over this queue's bus."""
        return DeadLetters(self.bus, self._ensured_lane)

    async def _ensured_lane(self, job_cls: type[Any]) -> Lane:
        await self.ensure(job_cls)
        return self.lane(job_cls)

    async def ensure(self, job_cls: type[JobBase], *, force: bool = False) -> JobSpec:
        """Make the job's queue and dead letters exist on the bus; returns its spec.

        Idempotent and safe to race with other processes. Existing limits are the operator's:
        they change only with `apply_limits`. Raises DependencyUnavailable when the bus does
        not answer, JobError `job.fair_unsupported` for a `fair` job on a driver that takes
        work in order only (`job.priority_unsupported` for a `prioritized` one).

        Args:
            job_cls: the Job class, on this queue's bus.
            force: ask the bus again even when this queue has already set the job up in this
                process (default False: once per process).
        """
        spec = self.spec(job_cls)
        if job_cls in self._ensured and not force:
            return spec
        for declared, needs, takes, code in (
            ("fair", "fair_lanes", "round-robin across keys", "job.fair_unsupported"),
            ("prioritized", "priority_lanes", "by priority", "job.priority_unsupported"),
        ):
            if getattr(spec, declared) and not getattr(self.bus, needs, False):
                raise JobError(
                    f"{spec.name}: {declared} = True needs a driver that takes work {takes} "
                    f"(every built-in one does); bus {self.bus.alias!r} is {self.bus.driver}, "
                    f"which takes it in order only: drop {declared}, or put the job on such a "
                    "bus",
                    code=code,
                )
        what = f"{spec.name}: cannot set up its queue"
        await self.ensure_lane(job_cls, job_lane(spec), what, force=force)
        return spec

    async def stats(self, job_cls: type[JobBase]) -> LaneStats:
        """The job's queue right now, as the engine counts it (for consoles and health pages).
        Raises DependencyUnavailable when the bus does not answer.

        Args:
            job_cls: the Job class, on this queue's bus (its queue is set up first if need be).
        """
        spec = await self.ensure(job_cls)
        return await self.lane_stats(job_lane(spec), f"cannot read {spec.name}'s queue")

    async def workers(self, job_cls: type[JobBase]) -> list[WorkerSeen]:
        """The consume loops of the job seen within the last 30 s (one per process), the last
        seen first: its worker, since when it runs, its jobs running now and settled since its
        start; a stopped one says when (`stopped_at`) until its record expires.

        Args:
            job_cls: the Job class, on this queue's bus (its queue is set up first if need be).
        """
        spec = await self.ensure(job_cls)
        return await self.lane_workers(job_lane(spec), f"cannot read {spec.name}'s workers")

    # -- enqueue ------------------------------------------------------------------------------

    async def enqueue(
        self,
        job_cls: type[JobBase],
        payload: Any,
        *,
        id: str | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        session: Session | None = None,
        key: str | None = None,
        priority: Priority | None = None,
    ) -> JobId:
        """Store one job and return its id once the bus has it (NATS: after the PubAck).

        Raises DependencyUnavailable when the bus does not answer; then the job may still have
        been stored, so give an `id` when a retry must not duplicate it.

        Args:
            job_cls: the Job class, on this queue's bus.
            payload: any JSON-serialisable value, or what the job's `schema` accepts (a dict
                or an instance); else JobError `job.invalid_payload` naming the problem, and
                nothing is stored.
            id: the dedup key: a second enqueue with the same id within 2 minutes is dropped
                and returns the same id, with `.duplicate` True. Default a random uuid; one
                given is 1-200 printable characters without spaces (else JobError
                `job.invalid_id`).
            delay: seconds or a timedelta (>= 0, else JobError `job.invalid_delay`) to hold the
                job for, without using a worker slot.
            run_at: an aware datetime to hold the job until, in the same way; not with
                `delay` (JobError `job.invalid_delay`).
            session: deprecated (goes in 0.3): write the job in your transaction with
                `outbox.enqueue(session, Job, payload)`, on any bus. Here, a SQLAlchemy session
                whose transaction the job joins, so it exists if and only if that transaction
                commits (postgres driver only; JobError `job.session_unsupported` elsewhere).
            key: a tenant, a customer (1-200 printable characters without spaces, else
                JobError `job.invalid_key`): what the job's limits per key count it under
                (`rate_limit` with "per": "key", `key_concurrency`) and, on a `fair` job, what
                takes turns.
            priority: "high", "normal" (None) or "low", on a `prioritized` job only (else
                JobError `job.invalid_priority`): its band. The bands take turns, high 6 of
                every 10 starts, normal 3, low 1, while each has jobs waiting.
        """
        if session is not None:
            deprecated(SESSION_SPELLING, SESSION_INSTEAD)
        spec = await self.ensure(job_cls)
        now_ms = clock.now_ms()  # one reading: a delay adds to the enqueue time exactly
        due_ms = due_ms_of(spec, delay, run_at, now_ms)
        message = encode_job(
            spec, payload, job_id=id, due_ms=due_ms, now_ms=now_ms, key=key, priority=priority
        )
        if tracing.tracer() is None:
            return await self._enqueue(spec, message, session)
        with tracing.producing(
            "send", spec.subject, system=self.bus.driver, ids=[message.id]
        ) as trace:
            return await self._enqueue(spec, replace(message, trace=trace), session)

    async def _enqueue(self, spec: JobSpec, message: Message, session: Session | None) -> JobId:
        lane = job_lane(spec)
        check_engine_cap(spec.name, [message.body], self.bus, "job")
        try:
            if session is not None:  # its record comes with its first run: not before a commit
                [stored] = publish_in(self.bus, session, lane, [message])
            else:
                [stored] = await self._publish(spec, lane, [message])
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot enqueue {spec.name}", exc) from exc
        await self.signal(
            "dispatch",
            job=spec.name,
            id=message.id,
            subject=spec.subject,
            run_at=message.run_at_ms,
            duplicate=not stored,
        )
        return JobId(message.id, duplicate=not stored)

    async def enqueue_many(
        self,
        job_cls: type[JobBase],
        payloads: Iterable[Any],
        *,
        key: str | None = None,
        priority: Priority | None = None,
    ) -> list[str]:
        """Store many jobs in one go; returns the ids (in order) once every one is stored.
        Every payload is checked before the first is sent.

        Args:
            job_cls: the Job class, on this queue's bus.
            payloads: one payload per job, each as `enqueue` takes it.
            key: every job's key, as in `enqueue`.
            priority: every job's band, as in `enqueue`.
        """
        spec = await self.ensure(job_cls)
        messages = [encode_job(spec, payload, key=key, priority=priority) for payload in payloads]
        if tracing.tracer() is None:
            return await self._enqueue_many(spec, messages)
        ids = [message.id for message in messages]
        with tracing.producing("send", spec.subject, system=self.bus.driver, ids=ids) as trace:
            return await self._enqueue_many(
                spec, [replace(message, trace=trace) for message in messages]
            )

    async def _enqueue_encoded(self, job_cls: type[JobBase], messages: list[Message]) -> None:
        """Store jobs already encoded (`encode_job`), as `enqueue_many` does: the outbox relay
        enqueues the jobs of its rows this way, each with its id as its dedup id, and the
        workflows their steps. Not an API: users enqueue with `Job.enqueue`/`enqueue_many`."""
        await self._enqueue_many(await self.ensure(job_cls), messages)

    async def _enqueue_many(self, spec: JobSpec, messages: list[Message]) -> list[str]:
        lane = job_lane(spec)
        check_engine_cap(spec.name, (message.body for message in messages), self.bus, "job")
        try:
            await self._publish(spec, lane, messages)
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot enqueue {len(messages)} x {spec.name}", exc) from exc
        if self.signals.has_observers("dispatch"):
            for message in messages:
                await self.signals.emit(
                    "dispatch", job=spec.name, id=message.id, subject=spec.subject
                )
        return [message.id for message in messages]

    async def _publish(self, spec: JobSpec, lane: Lane, messages: list[Message]) -> list[bool]:
        """Store the jobs and their first status records (`queued`, where none is there yet: a
        worker may have started one already, or the id is a duplicate's), sent together: one
        round trip for both. A publish that fails may still have stored its job (see
        `enqueue`), and its record says `queued` as it may be. Records that fail cost only
        themselves, said once the jobs are known stored: the enqueue stands or falls with its
        jobs. Raises the publish's DriverUnavailable."""
        if lane.keep_status_s <= 0:
            return await self.bus.publish(lane, messages)
        records = created(spec.name, messages)
        stored, recorded = await asyncio.gather(
            self.bus.publish(lane, messages),
            self.bus.put_records(lane, "status", records, create=True, confirm=False),
            return_exceptions=True,
        )
        if isinstance(stored, BaseException):
            raise stored  # the records' failure, if any, is the same outage: said once
        if isinstance(recorded, DriverUnavailable):
            logger.warning(
                "%s: %d job(s) stored, their status records not (%s)",
                spec.name,
                len(records),
                recorded,
            )
        elif isinstance(recorded, BaseException):
            raise recorded
        return stored

    # -- consume ------------------------------------------------------------------------------

    async def consume(self, job_cls: type[JobBase], handler_ctx: Context | None = None) -> None:
        """Run the job's consume loop in this process until `stop()` has drained it.

        Args:
            job_cls: the Job class, on this queue's bus.
            handler_ctx: what `run(payload, ctx)` receives, with this run's id, attempt and
                `progress()` on top (None, the default: the queue's context).
        """
        spec = await self.ensure(job_cls)
        job_run = threaded(spec.job_cls().run, spec.concurrency)
        contexts = RunContexts(
            handler_ctx or self.ctx, job=spec.name, worker=self.instance_id, report=self.signal
        )

        async def run(payload: Any, delivery: Delivery) -> Any:
            if spec.schema is not None:
                payload = fit_schema(spec, payload)
            run_ctx = contexts(delivery.id, delivery.attempt, delivery.flow_key)
            return await job_run(payload, run_ctx)

        lane = job_lane(spec)
        records = StatusWriter(self.bus, lane, worker=self.instance_id)
        await self.run_lane(
            job_cls, lane, spec, run, records, LaneControl(self.bus, lane), steps=self.workflows
        )


def queue_of(ctx: Context, bus: str) -> JobQueue:
    """The JobQueue of `bus` that `Job.enqueue` (and a workflow) uses, made once per context."""
    key = (JobQueue, bus)
    queue = ctx.memo.get(key)
    if queue is None:
        queue = ctx.memo[key] = JobQueue(ctx, bus)
    assert isinstance(queue, JobQueue)
    return queue


def publish_in(bus: Bus, session: Session, lane: Lane, messages: list[Message]) -> list[bool]:
    """Store jobs through the caller's SQLAlchemy session, on a driver that can (its
    `publish_in`); JobError `job.session_unsupported` on the others."""
    publish = getattr(bus, "publish_in", None)
    if publish is None:
        raise JobError(
            f"enqueue(..., session=...) needs a bus whose jobs live in the database (the "
            f"postgres driver); bus {bus.alias!r} is {bus.driver}",
            code="job.session_unsupported",
        )
    stored: list[bool] = publish(session, lane, messages)
    return stored
