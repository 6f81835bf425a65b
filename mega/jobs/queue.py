"""JobQueue: a job's streams on NATS JetStream, enqueueing, and the entry points of consuming.

Streams, per job subject (created by `ensure`, never modified once they exist):
    MEGA_JOBS_<s>      work queue (file storage) on `<subject>` and `<subject>._delay.*`
    MEGA_JOBS_<s>_DLQ  limits retention on `<subject>.dlq` (max_age, optional max_bytes)
and one durable pull consumer `mega_workers` on `<subject>` shared by every worker process:
explicit ack, `ack_wait = ack_wait_s`, `max_ack_pending = concurrency` (the cap for the whole
group), unlimited max_deliver (the consume loop decides when a job is dead).

A message is the JSON payload as body plus headers: `Mega-Job-Id`, `Mega-Enqueued-At` (epoch ms),
`Mega-Run-At` (epoch ms, delayed or requeued jobs) and `Nats-Msg-Id` when the caller gave an id
(JetStream drops a duplicate within its 2 minute window).
A delayed job is a broker-side message schedule (nats-server 2.12+): it waits in the stream
on `<subject>._delay.<token>` and the server publishes a fresh copy onto `<subject>` at its
time, so it holds no worker slot, no max_ack_pending and no delivery while it waits.
A DLQ requeue publishes a new message, so its delivery count (the attempt) restarts at 1.

`consume(JobClass)` runs the job's consume loop in this process and `stop()` drains every loop;
the loop itself (pulling, leases, retries, dead-lettering) is `_Consumer` in consumer.py.
Every step is reported to observers as a signal of SIGNALS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol, TypeVar

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from mega.context import Context
from mega.errors import DependencyUnavailable, JobError
from mega.jobs.consumer import NATS_ERRORS, _Consumer, job_id_of, schedules_supported
from mega.jobs.dlq import DeadLetters, DlqRecord
from mega.jobs.job import (
    CONSUMER_NAME,
    HEADER_RUN_AT,
    Job,
    JobSpec,
    due_ms_of,
    encode_job,
    validate_job,
)
from mega.jobs.progress import RunContexts
from mega.signals import Observer, Signals

logger = logging.getLogger("mega.jobqueue")

SIGNALS = ("dispatch", "start", "progress", "done", "retry", "fail", "dlq")
# JetStream's dedup window (its default); the DLQ's is shortened to a smaller max_age.
DEDUP_WINDOW_S = 120.0
# enqueue_many: time for every PubAck, on top of this much per message in the batch.
BULK_TIMEOUT_S = 5.0
BULK_TIMEOUT_PER_MSG_S = 0.001

# An exhausted job whose DLQ record cannot be written comes back after this long to try again.
DLQ_RETRY_DELAY_S = 5.0


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create a stream unless it exists; an existing one is never changed (its limits are the
    operator's). Safe to race with other processes."""
    assert config.name is not None
    try:
        await js.stream_info(config.name)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except APIError as exc:
        # A peer may have created it between our look-up and our create.
        try:
            await js.stream_info(config.name)
        except NotFoundError:
            raise JobError(
                f"cannot create stream {config.name} on {config.subjects}: {exc.description}",
                code="job.stream_conflict",
            ) from exc


async def ensure_consumer(
    js: JetStreamContext, stream: str, wanted: ConsumerConfig, *, what: str, apply_limits: bool
) -> None:
    """Create a durable consumer, or bring an existing one in line with `wanted`. Its limits
    (`ack_wait`, `max_ack_pending`: the class's `ack_wait_s` and `concurrency`) change only with
    `apply_limits`; otherwise a difference is said in one line and the running limits are kept,
    so a stale deployment cannot silently rewrite the whole fleet's."""
    assert wanted.durable_name is not None
    try:
        have = (await js.consumer_info(stream, wanted.durable_name)).config
    except NotFoundError:
        await js.add_consumer(stream, wanted)
        return
    running = (have.ack_wait, have.max_ack_pending)
    declared = (wanted.ack_wait, wanted.max_ack_pending)
    if running != declared:
        change = (
            f"{what}: the running consumer has concurrency {have.max_ack_pending} and ack wait "
            f"{have.ack_wait:g} s, the class says {wanted.max_ack_pending} and "
            f"{wanted.ack_wait:g} s"
        )
        if apply_limits:
            logger.info("%s: applying the class's (--apply-limits)", change)
        else:
            logger.warning(
                "%s: keeping the running ones (start with --apply-limits, or set "
                "apply_limits = True in the config, to change them)", change,
            )  # fmt: skip
            wanted = dataclasses.replace(
                wanted, ack_wait=have.ack_wait, max_ack_pending=have.max_ack_pending
            )
    fields = ("ack_wait", "max_ack_pending", "filter_subject", "filter_subjects")
    if all(getattr(have, name) == getattr(wanted, name) for name in fields):
        return
    # Without an action the server creates, or updates the editable fields in place.
    await js.add_consumer(stream, wanted)


def dlq_stream_config(
    name: str, subject: str, max_age_s: float, max_bytes: int | None, replicas: int = 1
) -> StreamConfig:
    """A dead-letter stream: limits retention, kept `max_age_s` (0: forever), optional byte cap,
    `replicas` copies in a cluster."""
    return StreamConfig(
        num_replicas=replicas,
        name=name,
        subjects=[subject],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=max_age_s or None,
        max_bytes=max_bytes,
        # The server refuses a dedup window longer than max_age.
        duplicate_window=min(DEDUP_WINDOW_S, max_age_s) if max_age_s else DEDUP_WINDOW_S,
    )


@dataclass(frozen=True)
class JobStats:
    """One job's queue at an instant. `pending`: enqueued, not yet delivered (delayed jobs not
    counted until due); `in_flight`: delivered and not yet acked (running, or waiting for a
    retry's backoff); `dlq`: dead letters kept."""

    pending: int
    in_flight: int
    dlq: int


# A driver's message, as its consume loop hands it to the job's runner.
M = TypeVar("M")


class DeadLetterTools(Protocol):
    """The DLQ tools of a queue, whatever its driver (`DeadLetters` on NATS)."""

    async def count(self, job_cls: type[Any]) -> int: ...
    async def list(self, job_cls: type[Any], limit: int = 50) -> list[DlqRecord]: ...
    async def requeue(self, job_cls: type[Any], job_id: str) -> int: ...
    async def requeue_all(self, job_cls: type[Any]) -> int: ...
    async def purge(self, job_cls: type[Any]) -> int: ...


class JobQueue:
    """Enqueue and consume the jobs of one bus alias, on the driver its config names.

    `JobQueue(ctx, alias)` gives the driver's queue: `NatsJobQueue` (below) for a `nats` bus,
    `MemoryJobQueue` (mega/jobs/memory.py) for a `memory` one; a Job does not change when its
    bus changes driver. `instance_id` names this process in DLQ records (default: the
    context's). `apply_limits`: a consumer whose running limits differ from the class's is
    changed (the worker's `--apply-limits`), not only reported. Observers: `on(name, fn)`
    with a name of SIGNALS; unknown names raise ValueError.
    """

    # driver name -> queue class; each driver module adds itself (the hosts import it).
    drivers: ClassVar[dict[str, type[JobQueue]]] = {}

    def __new__(cls, ctx: Context, bus_alias: str, **options: Any) -> JobQueue:
        if cls is JobQueue:
            driver = ctx.bus(bus_alias).driver
            cls = JobQueue.drivers.get(driver) or _nats_queue(driver)
        return super().__new__(cls)

    def __init__(
        self,
        ctx: Context,
        bus_alias: str,
        *,
        instance_id: str | None = None,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
        apply_limits: bool = False,
    ) -> None:
        self.ctx = ctx
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.apply_limits = apply_limits
        self.bus_alias = bus_alias
        self.instance_id = instance_id or ctx.instance_id
        self.signals = Signals(SIGNALS)
        self._specs: dict[type[Job], JobSpec] = {}

    def on(self, name: str, observer: Observer) -> None:
        self.signals.on(name, observer)

    def spec(self, job_cls: type[Job]) -> JobSpec:
        """The validated spec of a Job class on this queue's bus (cached)."""
        spec = self._specs.get(job_cls)
        if spec is None:
            spec = validate_job(job_cls, self.ctx.buses)
            if spec.bus != self.bus_alias:
                raise JobError(
                    f"{spec.name} is on bus {spec.bus!r}, this queue serves {self.bus_alias!r}",
                    code="job.wrong_bus",
                )
            self._specs[job_cls] = spec
        return spec

    async def signal(self, name: str, **fields: Any) -> None:
        """Notify observers, skipping the work when nobody listens (the hot path)."""
        if self.signals.has_observers(name):
            await self.signals.emit(name, **fields)

    def _runner(
        self, spec: JobSpec, handler_ctx: Context | None, job_id_of: Callable[[M], str]
    ) -> Callable[[Any, M, int], Awaitable[None]]:
        """What runs one delivery of a job, on every driver: `run(payload, ctx)` with the run's
        own JobContext (its id, read from the driver's message `M` by `job_id_of`, its attempt,
        and `progress()`, which reports through `signal`)."""
        job = spec.job_cls()
        contexts = RunContexts(
            handler_ctx or self.ctx, job=spec.name, worker=self.instance_id, report=self.signal
        )

        async def run(payload: Any, message: M, attempt: int) -> None:
            await job.run(payload, contexts(job_id_of(message), attempt))

        return run

    # -- what each driver implements ----------------------------------------------------------

    @property
    def dlq(self) -> DeadLetterTools:
        """DLQ tools (list, count, requeue, purge) over this queue's bus."""
        raise NotImplementedError

    async def stats(self, job_cls: type[Job]) -> JobStats:
        """The job's queue right now, as the broker counts it (for consoles and health pages)."""
        raise NotImplementedError

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        """Make the job's queue (and dead-letter queue) exist; returns its spec."""
        raise NotImplementedError

    async def enqueue(
        self,
        job_cls: type[Job],
        payload: Any,
        *,
        id: str | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
    ) -> str:
        """Persist one job and return its id once the broker has it (see NatsJobQueue)."""
        raise NotImplementedError

    async def enqueue_many(self, job_cls: type[Job], payloads: Iterable[Any]) -> list[str]:
        """Persist many jobs; returns their ids, in order, once every one is stored."""
        raise NotImplementedError

    async def consume(self, job_cls: type[Job], handler_ctx: Context | None = None) -> None:
        """Run the job's consume loop in this process until `stop()` has drained it."""
        raise NotImplementedError

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop consuming, wait up to `timeout_s` for running jobs, hand the rest back."""
        raise NotImplementedError


def _nats_queue(driver: str) -> type[JobQueue]:
    if driver != "nats":
        raise JobError(f"no job queue for bus driver {driver!r}", code="job.driver")
    return NatsJobQueue


class NatsJobQueue(JobQueue):
    """The jobs of one bus alias on NATS JetStream (see the module's docstring)."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        bus = ctx.bus(bus_alias)
        self.nc = bus.native
        # One JetStreamContext for the queue's life: its async-publish inbox is made once.
        self.js: JetStreamContext = bus.js
        self._ensured: set[type[Job]] = set()
        self._consumers: dict[type[Job], _Consumer] = {}
        self._stopped = False

    @property
    def dlq(self) -> DeadLetters:
        """DLQ tools (list, count, requeue, purge) over this queue's bus."""
        return DeadLetters(self.js, self.ensure)

    async def stats(self, job_cls: type[Job]) -> JobStats:
        """The job's queue right now, as the broker counts it (for consoles and health pages).

        Raises DependencyUnavailable when NATS does not answer."""
        spec = await self.ensure(job_cls)
        try:
            consumer = await self.js.consumer_info(spec.stream, CONSUMER_NAME)
            dlq = await self.js.stream_info(spec.dlq_stream)
        except NATS_ERRORS as exc:
            raise DependencyUnavailable("nats", f"cannot read {spec.name}'s queue: {exc}") from exc
        return JobStats(
            pending=consumer.num_pending or 0,
            in_flight=consumer.num_ack_pending or 0,
            dlq=dlq.state.messages,
        )

    # -- streams ------------------------------------------------------------------------------

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        """Create the job's work stream, DLQ stream and durable consumer where missing.

        Idempotent and safe to race with other processes. An existing stream is never changed
        (its limits are the operator's); an existing consumer keeps its limits unless the queue
        was made with `apply_limits` (see `ensure_consumer`). Raises DependencyUnavailable when
        NATS does not answer.
        """
        spec = self.spec(job_cls)
        if job_cls in self._ensured and not force:
            return spec
        try:
            await ensure_stream(
                self.js,
                StreamConfig(
                    name=spec.stream,
                    subjects=[spec.subject, spec.delay_subjects],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    duplicate_window=DEDUP_WINDOW_S,
                    allow_msg_schedules=True if schedules_supported(self.nc) else None,
                    num_replicas=spec.replicas,
                ),
            )
            await ensure_stream(
                self.js,
                dlq_stream_config(
                    spec.dlq_stream,
                    spec.dlq_subject,
                    spec.dlq_max_age_s,
                    spec.dlq_max_bytes,
                    spec.replicas,
                ),
            )
            await self._ensure_consumer(spec)
        except NATS_ERRORS as exc:
            raise DependencyUnavailable(
                "nats", f"{spec.name}: cannot set up its streams on bus {self.bus_alias!r}: {exc}"
            ) from exc
        self._ensured.add(job_cls)
        return spec

    async def _ensure_consumer(self, spec: JobSpec) -> None:
        wanted = ConsumerConfig(
            durable_name=CONSUMER_NAME,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=spec.ack_wait_s,
            max_ack_pending=spec.concurrency,
            max_deliver=-1,
            filter_subject=spec.subject,
        )
        await ensure_consumer(
            self.js, spec.stream, wanted, what=spec.name, apply_limits=self.apply_limits
        )

    # -- enqueue ------------------------------------------------------------------------------

    async def enqueue(
        self,
        job_cls: type[Job],
        payload: Any,
        *,
        id: str | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
    ) -> str:
        """Persist one job and return its id once JetStream has acknowledged it.

        `payload`: any JSON-serialisable value (else JobError `job.invalid_payload`, nothing is
        published). `id`: the dedup key (a second enqueue with the same id within 2 minutes is
        dropped by JetStream and returns the same id); default a random uuid. `delay` (seconds
        or timedelta) or `run_at` (aware datetime): hold the job until then without using a
        worker slot. Raises DependencyUnavailable at once while NATS is disconnected, or after
        the publish timeout (5 s) when it does not answer; in that last case the job may still
        have been stored, so give an `id` when a retry must not duplicate it.
        """
        spec = await self.ensure(job_cls)
        due_ms = due_ms_of(spec, delay, run_at)
        if due_ms is not None and not schedules_supported(self.nc):
            raise JobError(
                f"{spec.name}: delayed jobs need nats-server 2.12+ (message schedules)",
                code="job.delay_unsupported",
            )
        job_id, subject, body, headers = encode_job(spec, payload, job_id=id, due_ms=due_ms)
        self._check_connected(spec)
        try:
            ack = await self.js.publish(subject, body, headers=headers)
        except NATS_ERRORS as exc:
            raise DependencyUnavailable("nats", f"cannot enqueue {spec.name}: {exc}") from exc
        await self.signal(
            "dispatch",
            job=spec.name,
            id=job_id,
            subject=spec.subject,
            run_at=headers.get(HEADER_RUN_AT),
            duplicate=bool(ack.duplicate),
        )
        return job_id

    async def enqueue_many(self, job_cls: type[Job], payloads: Iterable[Any]) -> list[str]:
        """Persist many jobs with their publishes pipelined; returns the ids (in order) once
        every PubAck is in. Every payload is checked before the first publish."""
        spec = await self.ensure(job_cls)
        envelopes = [encode_job(spec, payload) for payload in payloads]
        self._check_connected(spec)
        futures: list[asyncio.Future[Any]] = []
        try:
            for _, subject, body, headers in envelopes:
                futures.append(await self.js.publish_async(subject, body, headers=headers))
            timeout_s = BULK_TIMEOUT_S + BULK_TIMEOUT_PER_MSG_S * len(envelopes)
            await asyncio.wait_for(asyncio.gather(*futures), timeout_s)
        except NATS_ERRORS as exc:
            for future in futures:
                future.cancel()  # frees nats-py's in-flight slot of an ack that never came
            raise DependencyUnavailable(
                "nats", f"cannot enqueue {len(envelopes)} x {spec.name}: {exc}"
            ) from exc
        ids = [job_id for job_id, *_ in envelopes]
        if self.signals.has_observers("dispatch"):
            for job_id in ids:
                await self.signals.emit("dispatch", job=spec.name, id=job_id, subject=spec.subject)
        return ids

    def _check_connected(self, spec: JobSpec) -> None:
        # While reconnecting, nats-py buffers publishes and sends them once back: an enqueue
        # that timed out would then still run. Refusing up front keeps "raised" meaning "not
        # enqueued" (but for a drop in mid-flight: pass an `id` to make retries safe).
        if not self.nc.is_connected:
            raise DependencyUnavailable(
                "nats", f"cannot enqueue {spec.name}: NATS bus {self.bus_alias!r} is not connected"
            )

    # -- consume ------------------------------------------------------------------------------

    async def consume(self, job_cls: type[Job], handler_ctx: Context | None = None) -> None:
        """Run the job's consume loop in this process until `stop()` has drained it.

        `handler_ctx` is what `run(payload, ctx)` receives (default: the queue's context).
        """
        spec = await self.ensure(job_cls)
        if self._stopped:
            return  # stop() came while we were setting up
        if job_cls in self._consumers:
            raise JobError(f"{spec.name} is already consumed by this queue", code="job.twice")
        run = self._runner(spec, handler_ctx, functools.partial(job_id_of, spec))
        consumer = _Consumer(self, spec, run, functools.partial(self.ensure, job_cls, force=True))
        self._consumers[job_cls] = consumer
        try:
            await consumer.run()
        finally:
            del self._consumers[job_cls]

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop pulling, wait up to `timeout_s` for in-flight jobs, hand the rest back.

        Final for consuming (enqueue keeps working). Jobs still running at the timeout are
        cancelled and nacked, so another worker gets them after a short delay
        (consumer.HAND_BACK_DELAY_S)."""
        self._stopped = True
        consumers = list(self._consumers.values())
        for consumer in consumers:
            consumer.request_stop(timeout_s)
        await asyncio.gather(*(consumer.closed.wait() for consumer in consumers))
        with contextlib.suppress(*NATS_ERRORS):
            await self.nc.flush(timeout=1)  # acks and naks of the drain leave before we return
