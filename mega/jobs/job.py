"""A job is a class: where it lives on the bus (`subject`, `bus`), how it is run (`concurrency`,
`retries`, `backoff`, `ack_wait_s`), how long its failures are kept (`dlq_*`), what its payload
is (`schema`, optional) and what it does (`run`).

    class Receipt(BaseModel):
        order_id: int
        email: str

    class SendReceipt(Job):
        subject = "shop.receipt"
        bus = "jobs"
        schema = Receipt         # optional: checked at enqueue, handed to `run` as a Receipt
        concurrency = 2          # in flight for the whole worker group (NATS max_ack_pending)
        retries = 2              # extra tries after the first: 3 runs at most
        backoff = {"type": "exponential", "initial": 500, "max": 2000}

        async def run(self, receipt: Receipt, ctx: JobContext) -> None:
            await send_email(receipt.email)
            await ctx.progress(1.0, "sent")   # optional: a `progress` signal to observers

    await SendReceipt.enqueue(ctx, {"order_id": 7, "email": "ada@example.com"})

Delivery is at-least-once: a worker killed mid-run, or a lost ack, runs the job again, so `run`
must be idempotent (key its side effects on the job id or on the payload).

A plain `def run(self, payload, ctx)` (blocking code: a synchronous client, a file) runs on a
worker thread, at most `concurrency` at once, while the event loop keeps renewing its lease.
It cannot `await`; `anyio.from_thread.run(ctx.progress, 0.5)` reports progress from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mega.deprecation import deprecated
from mega.drivers.base import Priority
from mega.jobs.queue import SESSION_INSTEAD, SESSION_SPELLING, queue_of
from mega.jobs.spec import JobBase, JobId
from mega.jobs.workflow_records import UNSET, Step
from mega.lanes.control import Cancelled
from mega.lanes.records import JobStatus

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from mega.context import Context


class Job(JobBase):
    """Base class of every job. Subclasses set `subject` and `bus` and override `run`.

    Class attributes: `subject` (letters, digits, `.`, `_` and `-`; not ending in `.dlq`), `bus`
    (a bus alias of the config), `schema` (None or a pydantic model: the payload is validated at
    enqueue and `run` receives an instance), `concurrency` (>= 1, messages in flight for the
    whole worker group, so raise it with the number of worker processes), `retries` (>= 0 extra
    tries), `backoff` (exponential, ms), `ack_wait_s` (> 0 s before an unacknowledged delivery
    is redelivered; running jobs renew it), `dlq_max_age_s` (>= 0 s, 0 keeps dead letters
    forever), `dlq_max_bytes` (None or a positive byte cap of the DLQ stream),
    `max_payload_bytes` (1 MiB: a larger payload, as JSON, is refused at enqueue with
    `job.payload_too_large`), `replicas` (1 to 5: copies of its streams in a NATS cluster; 3
    survives the loss of one node), `timeout_s` (None or > 0 s: a run's limit), `permanent`
    (errors that skip the retries), `rate_limit` (None or {"limit": n, "period_s": s}: starts
    across the whole group, or with "per": "key" for each key; see mega/lanes/ratelimit.py),
    `key_concurrency` (None or >= 1: runs of one key at once across the group; see
    mega/lanes/flow.py), `flow_cache` (the cache both count in; None: the config's only cache),
    `fair` (workers take the keys' jobs in turn), `prioritized` (enqueue takes a `priority`; the
    bands take turns, high most), `durable` (on Redis, enqueue returns once a replica has the
    job too: see `Lane.durable`), `keep_status_s` and `keep_result_s`, `name` (defaults to the
    class name).
    """

    @classmethod
    async def enqueue(
        cls,
        ctx: Context,
        payload: Any = None,
        *,
        id: str | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        session: Session | None = None,
        key: str | None = None,
        priority: Priority | None = None,
        delay_s: float | None = None,
    ) -> JobId:
        """Store one run of this job on its own bus, with the JobQueue kept on `ctx` (its
        setup is done once per process), and return its id once the bus has it.

        Args:
            ctx: the host's context, or a run's.
            payload: JSON, or the job's `schema` (checked here: JobError `job.invalid_payload`).
            id: the job's id and dedup key (default a random one): the same id within the
                bus's dedup window is stored once, and the answer says `.duplicate`.
            delay: seconds (or a timedelta) to hold it before it may run.
            run_at: an aware datetime before which it does not run (not with `delay`).
            session: deprecated (goes in 0.3): write the job in your transaction with
                `outbox.enqueue(session, Job, payload)`, on any bus. Here, a SQLAlchemy
                session whose transaction stores it (postgres bus only).
            key: its fair-turn and per-key limit key (a tenant, a user).
            priority: "high", "normal" or "low", for a `prioritized` job.
            delay_s: the old spelling of `delay` (warns once; goes in 0.3).
        """
        if delay_s is not None:
            deprecated("Job.enqueue(delay_s=...)", "Job.enqueue(delay=...)")
            delay = delay_s if delay is None else delay
        if session is not None:
            deprecated(SESSION_SPELLING, SESSION_INSTEAD)
        return await queue_of(ctx, cls.bus).enqueue(
            cls,
            payload,
            id=id,
            delay=delay,
            run_at=run_at,
            session=session,
            key=key,
            priority=priority,
        )

    @classmethod
    async def enqueue_many(
        cls,
        ctx: Context,
        payloads: Iterable[Any],
        *,
        key: str | None = None,
        priority: Priority | None = None,
    ) -> list[str]:
        """Store many runs of this job in one go (pipelined), and return their ids in order
        once every one is stored. Every payload is checked before the first is sent.

        Args:
            ctx: the host's context, or a run's.
            payloads: one payload per job, each as `enqueue` takes it.
            key: every job's key, as in `enqueue`.
            priority: every job's band, as in `enqueue`.
        """
        return await queue_of(ctx, cls.bus).enqueue_many(cls, payloads, key=key, priority=priority)

    @classmethod
    def step(
        cls, payload: Any = UNSET, *, key: str | None = None, priority: Priority | None = None
    ) -> Step:
        """This job as a step of a workflow (`chain`, `group`; see mega/jobs/workflow.py).

        Args:
            payload: the step's payload, as `enqueue` takes it. Without one, a chain's step
                receives the previous step's result, and a group's callback its outcomes alone.
            key: the step's job's key, as `enqueue` takes it (a tenant's fair turns).
            priority: the step's job's band, as `enqueue` takes it (a `prioritized` job's).
        """
        return Step(cls, payload, key, priority)

    @classmethod
    async def status(cls, ctx: Context, job_id: str) -> JobStatus | None:
        """The status record of one job of this class: `JobQueue.status` on its own bus.

        Args:
            ctx: the host's context, or a run's.
            job_id: the job's id, as `enqueue` returned it.
        """
        return await queue_of(ctx, cls.bus).status(cls, job_id)

    @classmethod
    async def result(cls, ctx: Context, job_id: str, *, timeout_s: float | None = None) -> Any:
        """What one job of this class returned: `JobQueue.result` on its own bus.

        Args:
            ctx: the host's context, or a run's.
            job_id: the job's id, as `enqueue` returned it.
            timeout_s: how long to wait for the job to end, in seconds, then TimeoutError
                (None, the default: no limit).
        """
        return await queue_of(ctx, cls.bus).result(cls, job_id, timeout_s=timeout_s)

    @classmethod
    async def cancel(cls, ctx: Context, job_id: str) -> Cancelled:
        """Cancel one job of this class: `JobQueue.cancel` on its own bus.

        Args:
            ctx: the host's context, or a run's.
            job_id: the job's id, as `enqueue` returned it.
        """
        return await queue_of(ctx, cls.bus).cancel(cls, job_id)
