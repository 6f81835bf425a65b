"""JobQueue: enqueue jobs onto NATS JetStream and consume them with retries and a DLQ.

Streams, per job subject (created by `ensure`, never modified once they exist):
    MEGA_JOBS_<s>      work queue (file storage) on `<subject>` and `<subject>._delay.*`
    MEGA_JOBS_<s>_DLQ  limits retention on `<subject>.dlq` (max_age, optional max_bytes)
and one durable pull consumer `mega_workers` on `<subject>` shared by every worker process:
explicit ack, `ack_wait = ack_wait_s`, `max_ack_pending = concurrency` (the cap for the whole
group), unlimited max_deliver (the queue decides when a job is dead, see below).

A message is the JSON payload as body plus headers: `Mega-Job-Id`, `Mega-Enqueued-At` (epoch ms),
`Mega-Run-At` (epoch ms, delayed or requeued jobs) and `Nats-Msg-Id` when the caller gave an id
(JetStream drops a duplicate within its 2 minute window).

Attempts are JetStream's own delivery count, `num_delivered`, so they survive a worker crash:
every delivery of a message is one attempt. A retry is `nak(delay=backoff)` of the same message
(the next delivery is the next attempt); while it waits, NATS still counts it against
max_ack_pending, so a backing-off job holds one of the group's `concurrency` slots.
A delayed job is a broker-side message schedule (nats-server 2.12+): it waits in the stream
on `<subject>._delay.<token>` and the server publishes a fresh copy onto `<subject>` at its
time, so it holds no worker slot, no max_ack_pending and no delivery while it waits.
A DLQ requeue publishes a new message, so its count restarts at 1 ("attempts reset").
A delivery beyond `retries + 1` means the last attempt never reported back (the job killed its
worker): it goes straight to the DLQ as `WorkerCrashed` instead of running again.

Consuming (see `_Consumer`): pull requests ask for at most the free slots, messages are run as
they arrive (no waiting for a batch to fill, which is what keeps start latency low), running
jobs renew their lease every `ack_wait_s / 3`, and a NATS outage is waited out, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Coroutine, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.msg import Msg
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

from app.mega.backoff import backoff_delay_ms
from app.mega.context import Context
from app.mega.dlq import DeadLetter, make_record
from app.mega.errors import DependencyUnavailable, JobError, MegaError
from app.mega.events import EventEmitter, Observer
from app.mega.job import (
    CONSUMER_NAME,
    HEADER_ENQUEUED_AT,
    HEADER_JOB_ID,
    HEADER_RUN_AT,
    NATS_MSG_ID,
    Job,
    JobSpec,
    due_ms_of,
    encode_job,
    validate_job,
)

if TYPE_CHECKING:
    from app.mega.dlq import DeadLetters

logger = logging.getLogger("mega.jobqueue")

EVENT_NAMES = ("dispatch", "start", "done", "retry", "fail", "dlq")
# Errors that mean "NATS is not answering right now" rather than "this request is wrong".
NATS_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)
# JetStream's dedup window (its default); the DLQ's is shortened to a smaller max_age.
DEDUP_WINDOW_S = 120.0
# enqueue_many: time for every PubAck, on top of this much per message in the batch.
BULK_TIMEOUT_S = 5.0
BULK_TIMEOUT_PER_MSG_S = 0.001
# Broker-side message schedules (delayed jobs) exist since this nats-server version.
SCHEDULES_SINCE = (2, 12)

# A pull request lives this long on the server; an idle loop renews it this often.
PULL_EXPIRES_S = 5.0
# Credit of pull requests that never answered (lost in an outage) is forgotten this much after
# they should have expired.
PULL_GRACE_S = 1.0
# Pull again once this fraction of the slots is free (or nothing is asked at all): one request
# per half window keeps messages flowing without one request per job.
REFILL_FRACTION = 0.5
# An idle loop wakes this often to notice a reconnect (pull requests do not survive one).
HOUSEKEEPING_S = 0.5
# Pause after NATS refused a pull (JetStream restarting, consumer gone) before asking again.
OUTAGE_BACKOFF_S = 0.25
# An exhausted job whose DLQ record cannot be written comes back after this long to try again.
DLQ_RETRY_DELAY_S = 5.0
# A job cut off by the drain timeout is handed back to be redelivered after this long.
HAND_BACK_DELAY_S = 1.0
# nats-py sends a bare nak for nak(delay=0): a zero backoff still takes the delayed path.
MIN_NAK_DELAY_S = 0.001
# DLQ records whose publish failed, kept so the redelivery carries the real error.
UNREPORTED_MEMO_SIZE = 1024
# Error messages in events and DLQ records are cut to this many characters.
MAX_ERROR_CHARS = 2000


class JobQueue:
    """Enqueue and consume the jobs of one bus alias.

    `instance_id` names this process in DLQ records (default: the context's). Observers:
    `on(name, fn)` with a name of EVENT_NAMES; unknown names raise ValueError.
    """

    def __init__(
        self,
        ctx: Context,
        bus_alias: str,
        *,
        instance_id: str | None = None,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
    ) -> None:
        self.ctx = ctx
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.bus_alias = bus_alias
        self.instance_id = instance_id or ctx.instance_id
        self.events = EventEmitter(EVENT_NAMES)
        bus = ctx.bus(bus_alias)
        self.nc = bus.native
        # One JetStreamContext for the queue's life: its async-publish inbox is made once.
        self.js: JetStreamContext = bus.js
        self._specs: dict[type[Job], JobSpec] = {}
        self._ensured: set[type[Job]] = set()
        self._consumers: dict[type[Job], _Consumer] = {}
        self._stopped = False

    def on(self, name: str, observer: Observer) -> None:
        self.events.on(name, observer)

    @property
    def dlq(self) -> DeadLetters:
        """DLQ tools (list, count, requeue, purge) over this queue."""
        from app.mega.dlq import DeadLetters

        return DeadLetters(self)

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

    # -- streams ------------------------------------------------------------------------------

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        """Create the job's work stream, DLQ stream and durable consumer where missing.

        Idempotent and safe to race with other processes. An existing stream is never changed
        (its limits are the operator's); the consumer is brought in line with the class
        (`ack_wait_s`, `concurrency`), since its config is the job's contract. Raises
        DependencyUnavailable when NATS does not answer.
        """
        spec = self.spec(job_cls)
        if job_cls in self._ensured and not force:
            return spec
        try:
            await self._ensure_stream(
                StreamConfig(
                    name=spec.stream,
                    subjects=[spec.subject, spec.delay_subjects],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    duplicate_window=DEDUP_WINDOW_S,
                    allow_msg_schedules=True if self._schedules_supported() else None,
                )
            )
            max_age = spec.dlq_max_age_s
            await self._ensure_stream(
                StreamConfig(
                    name=spec.dlq_stream,
                    subjects=[spec.dlq_subject],
                    retention=RetentionPolicy.LIMITS,
                    storage=StorageType.FILE,
                    max_age=max_age or None,
                    max_bytes=spec.dlq_max_bytes,
                    # The server refuses a dedup window longer than max_age.
                    duplicate_window=min(DEDUP_WINDOW_S, max_age) if max_age else DEDUP_WINDOW_S,
                )
            )
            await self._ensure_consumer(spec)
        except NATS_ERRORS as exc:
            raise DependencyUnavailable(
                "nats", f"{spec.name}: cannot set up its streams on bus {self.bus_alias!r}: {exc}"
            ) from exc
        self._ensured.add(job_cls)
        return spec

    async def _ensure_stream(self, config: StreamConfig) -> None:
        assert config.name is not None
        try:
            await self.js.stream_info(config.name)
            return  # exists: never touch an operator's limits
        except NotFoundError:
            pass
        try:
            await self.js.add_stream(config)
        except APIError as exc:
            # A peer may have created it between our look-up and our create.
            try:
                await self.js.stream_info(config.name)
            except NotFoundError:
                raise JobError(
                    f"cannot create stream {config.name} on {config.subjects}: {exc.description}",
                    code="job.stream_conflict",
                ) from exc

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
        try:
            have = (await self.js.consumer_info(spec.stream, CONSUMER_NAME)).config
            if (have.ack_wait, have.max_ack_pending) == (spec.ack_wait_s, spec.concurrency):
                return
            logger.info("%s: updating consumer to ack_wait/concurrency of the class", spec.name)
        except NotFoundError:
            pass
        # Without an action the server creates, or updates the editable fields in place.
        await self.js.add_consumer(spec.stream, wanted)

    def _schedules_supported(self) -> bool:
        version = self.nc.connected_server_version
        return (version.major, version.minor) >= SCHEDULES_SINCE

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
        if due_ms is not None and not self._schedules_supported():
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
        await self.emit(
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
        if self.events.has_observers("dispatch"):
            for job_id in ids:
                await self.events.emit("dispatch", job=spec.name, id=job_id, subject=spec.subject)
        return ids

    def _check_connected(self, spec: JobSpec) -> None:
        # While reconnecting, nats-py buffers publishes and sends them once back: an enqueue
        # that timed out would then still run. Refusing up front keeps "raised" meaning "not
        # enqueued" (but for a drop in mid-flight: pass an `id` to make retries safe).
        if not self.nc.is_connected:
            raise DependencyUnavailable(
                "nats", f"cannot enqueue {spec.name}: bus {self.bus_alias!r} is not connected"
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
        consumer = _Consumer(self, spec, handler_ctx or self.ctx)
        self._consumers[job_cls] = consumer
        try:
            await consumer.run()
        finally:
            del self._consumers[job_cls]

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop pulling, wait up to `timeout_s` for in-flight jobs, hand the rest back.

        Final for consuming (enqueue keeps working). Jobs still running at the timeout are
        cancelled and nacked, so another worker gets them after HAND_BACK_DELAY_S."""
        self._stopped = True
        consumers = list(self._consumers.values())
        for consumer in consumers:
            consumer.request_stop(timeout_s)
        await asyncio.gather(*(consumer.closed.wait() for consumer in consumers))
        with contextlib.suppress(*NATS_ERRORS):
            await self.nc.flush(timeout=1)  # acks and naks of the drain leave before we return

    async def emit(self, name: str, **fields: Any) -> None:
        """Notify observers, skipping the work when nobody listens (the hot path)."""
        if self.events.has_observers(name):
            await self.events.emit(name, **fields)


# -- the consume loop --------------------------------------------------------------------------


class _Lease:
    """A message being run and when its ack wait was last renewed (monotonic s)."""

    __slots__ = ("msg", "renewed_at")

    def __init__(self, msg: Msg, renewed_at: float) -> None:
        self.msg = msg
        self.renewed_at = renewed_at


class _Consumer:
    """One job's consume loop in this process.

    Why not `PullSubscription.fetch(n)`: once the stream is empty, fetch waits for all `n`
    messages or its timeout, so a lone job would wait seconds for a batch to fill. Here pull
    requests are sent by hand (`$JS.API.CONSUMER.MSG.NEXT`) to one inbox, and every message
    starts its job the moment it lands. `credits` counts messages asked for and not yet
    received; asking only for `concurrency - running - credits` keeps this process within its
    slots, and the consumer's max_ack_pending keeps the whole group within `concurrency`.
    """

    def __init__(self, queue: JobQueue, spec: JobSpec, ctx: Context) -> None:
        self.queue = queue
        self.spec = spec
        self.ctx = ctx
        self.job = spec.job_cls()
        self.nc = queue.nc
        self.running: dict[asyncio.Task[None], _Lease] = {}
        self.credits = 0
        self.credits_expire_at = 0.0
        self.refill_at = max(1, math.ceil(spec.concurrency * REFILL_FRACTION))
        self.pause_until = 0.0
        self.needs_ensure = False
        self.last_warning = ""
        self.wakeup = asyncio.Event()
        self.stopping = False
        self.drain_timeout_s = 0.0
        self.closed = asyncio.Event()
        self.unreported: OrderedDict[int, DeadLetter] = OrderedDict()
        self.pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{CONSUMER_NAME}"
        self.pull_expires_ns = int(PULL_EXPIRES_S * 1e9)

    def request_stop(self, timeout_s: float) -> None:
        self.stopping = True
        self.drain_timeout_s = timeout_s
        self.wakeup.set()

    async def run(self) -> None:
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=self._on_message)
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            await self._pull_loop(inbox)
            await self._drain()
        finally:
            heartbeat.cancel()
            # Left only if run() itself was cancelled, or a message landed after the drain.
            for task in self.running:
                task.cancel()
            with contextlib.suppress(*NATS_ERRORS):
                await sub.unsubscribe()
            self.closed.set()

    # -- pulling ----------------------------------------------------------------------------

    async def _pull_loop(self, inbox: str) -> None:
        reconnects = self.nc.stats["reconnects"]
        while not self.stopping:
            self.wakeup.clear()
            now = time.monotonic()
            if self.nc.stats["reconnects"] != reconnects or (
                self.credits and now > self.credits_expire_at
            ):
                # Requests made before a reconnect are gone and will never answer. A late
                # message of one is still capped by max_ack_pending.
                reconnects = self.nc.stats["reconnects"]
                self.credits = 0
            if self.needs_ensure and now >= self.pause_until:
                await self._ensure_again()
            free = self.spec.concurrency - len(self.running) - self.credits
            if (
                free > 0
                and (free >= self.refill_at or self.credits == 0)
                and now >= self.pause_until
                and self.nc.is_connected
            ):
                await self._pull(inbox, free, now)
            wait_s = HOUSEKEEPING_S
            if self.pause_until > now:
                wait_s = min(wait_s, self.pause_until - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self.wakeup.wait()

    async def _pull(self, inbox: str, batch: int, now: float) -> None:
        request = b'{"batch":%d,"expires":%d}' % (batch, self.pull_expires_ns)
        try:
            await self.nc.publish(self.pull_subject, request, reply=inbox)
        except NATS_ERRORS as exc:
            logger.debug("%s: pull failed (%s); retrying", self.spec.name, exc)
            self.pause_until = now + OUTAGE_BACKOFF_S
            return
        self.credits += batch
        self.credits_expire_at = now + PULL_EXPIRES_S + PULL_GRACE_S

    async def _ensure_again(self) -> None:
        self.needs_ensure = False
        try:
            await self.queue.ensure(self.spec.job_cls, force=True)
        except MegaError as exc:
            self._warn(f"{self.spec.name}: cannot restore its stream/consumer yet: {exc}")
            self.needs_ensure = True
            self.pause_until = time.monotonic() + OUTAGE_BACKOFF_S

    async def _on_message(self, msg: Msg) -> None:
        if not msg.reply:  # job messages carry an ack subject; status messages do not
            self._on_status(msg)
            return
        if self.credits:
            self.credits -= 1
        task = asyncio.create_task(self._process(msg))
        self.running[task] = _Lease(msg, time.monotonic())
        task.add_done_callback(self._on_done)

    def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":  # idle heartbeat (not asked for)
            return
        # The request is over: drop what it will never deliver (all of it if the server
        # does not say).
        unfilled = headers.get("Nats-Pending-Messages")
        self.credits = max(0, self.credits - int(unfilled)) if unfilled else 0
        if status != "408":  # anything but a plain expiry: the consumer is not being served
            description = headers.get("Description", "")
            self._warn(f"{self.spec.name}: pull answered {status} {description}")
            self.pause_until = time.monotonic() + OUTAGE_BACKOFF_S
            if status == "404" or "deleted" in description.lower():
                self.needs_ensure = True
        self.wakeup.set()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: job task crashed", self.spec.name, exc_info=task.exception())
        free = self.spec.concurrency - len(self.running) - self.credits
        if free >= self.refill_at or (free > 0 and not self.credits):
            self.wakeup.set()

    def _warn(self, message: str) -> None:
        # An outage repeats the same answer several times a second: say it once.
        if message != self.last_warning:
            logger.warning("%s", message)
            self.last_warning = message

    # -- running ----------------------------------------------------------------------------

    async def _process(self, msg: Msg) -> None:
        spec = self.spec
        meta = msg.metadata
        attempt = meta.num_delivered
        headers = msg.headers or {}
        job_id = headers.get(HEADER_JOB_ID) or f"{spec.stream}:{meta.sequence.stream}"
        enqueued_at = _int_header(headers, HEADER_ENQUEUED_AT)
        try:
            payload = json.loads(msg.data)
        except ValueError as exc:  # also bad UTF-8
            await self.queue.emit(
                "fail", job=spec.name, id=job_id, attempt=attempt, phase="decode",
                error_type="DecodeError", error=str(exc),
            )  # fmt: skip
            record = make_record(
                spec, job_id, None, "DecodeError", str(exc), attempt, enqueued_at,
                self.queue.instance_id, raw=msg.data,
            )  # fmt: skip
            await self._dead_letter(msg, record, terminate=True)
            return
        if attempt > spec.max_attempts:
            unreported = self.unreported.get(meta.sequence.stream)
            if unreported is None:  # not a DLQ publish of ours that failed: a crash
                unreported = self._crash_record(msg, job_id, payload, enqueued_at)
                await self.queue.emit(
                    "fail", job=spec.name, id=job_id, attempt=attempt, phase="run",
                    error_type="WorkerCrashed", error=unreported["error"]["message"],
                )  # fmt: skip
            await self._dead_letter(msg, unreported)
            return
        started = time.time()
        run_at = _int_header(headers, HEADER_RUN_AT) or enqueued_at
        await self.queue.emit(
            "start", job=spec.name, id=job_id, attempt=attempt,
            latency_ms=None if run_at is None else max(0, round(started * 1000) - run_at),
        )  # fmt: skip
        try:
            await self.job.run(payload, self.ctx)
        except asyncio.CancelledError:
            # Cut off by the drain timeout: hand it back now rather than after the ack wait.
            await _settle(msg.nak(delay=HAND_BACK_DELAY_S))
            raise
        except Exception as exc:
            duration_ms = round((time.time() - started) * 1000, 3)
            await self._failed(msg, job_id, payload, attempt, enqueued_at, exc, duration_ms)
            return
        await _settle(msg.ack())
        await self.queue.emit(
            "done", job=spec.name, id=job_id, attempt=attempt,
            duration_ms=round((time.time() - started) * 1000, 3),
        )  # fmt: skip

    async def _failed(
        self,
        msg: Msg,
        job_id: str,
        payload: Any,
        attempt: int,
        enqueued_at: int | None,
        exc: Exception,
        duration_ms: float,
    ) -> None:
        spec = self.spec
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        fields = {"job": spec.name, "id": job_id, "attempt": attempt, "duration_ms": duration_ms}
        if attempt < spec.max_attempts:
            delay_ms = backoff_delay_ms(attempt, spec.backoff)
            await _settle(msg.nak(delay=max(delay_ms / 1000, MIN_NAK_DELAY_S)))
            await self.queue.emit(
                "retry", **fields, delay_ms=delay_ms, error_type=error_type, error=error
            )
            return
        await self.queue.emit("fail", **fields, phase="run", error_type=error_type, error=error)
        record = make_record(
            spec, job_id, payload, error_type, error, attempt, enqueued_at, self.queue.instance_id
        )
        await self._dead_letter(msg, record)

    def _crash_record(
        self, msg: Msg, job_id: str, payload: Any, enqueued_at: int | None
    ) -> DeadLetter:
        """The record of a delivery past `retries + 1` whose last attempt never reported back."""
        runs = msg.metadata.num_delivered - 1
        message = (
            f"attempt {runs} of {self.spec.max_attempts} never reported back: its worker died "
            "(crash, os._exit, OOM kill) or its DLQ record could not be written"
        )
        return make_record(
            self.spec, job_id, payload, "WorkerCrashed", message, runs, enqueued_at,
            self.queue.instance_id,
        )  # fmt: skip

    async def _dead_letter(self, msg: Msg, record: DeadLetter, *, terminate: bool = False) -> None:
        """Publish the record, wait for its PubAck, and only then ack (or term) the original.

        If the publish fails the original is nacked with a delay, so it comes back and tries
        again: nothing is lost, and the dedup id keeps a retried record single."""
        spec, seq = self.spec, msg.metadata.sequence.stream
        # Keyed on the work-stream sequence: a retried publish of this message dedups, while
        # the same job requeued (a new message) and failing again gets a record of its own.
        headers = {NATS_MSG_ID: f"{record['id']}:dlq:{seq}"}
        try:
            await self.queue.js.publish(
                spec.dlq_subject, json.dumps(record).encode(), headers=headers
            )
        except NATS_ERRORS as exc:
            self.unreported[seq] = record
            while len(self.unreported) > UNREPORTED_MEMO_SIZE:
                self.unreported.popitem(last=False)
            await _settle(msg.nak(delay=self.queue.dlq_retry_delay_s))
            await self.queue.emit(
                "fail", job=spec.name, id=record["id"], attempt=msg.metadata.num_delivered,
                phase="dlq_publish", error_type=type(exc).__name__, error=str(exc) or repr(exc),
            )  # fmt: skip
            return
        self.unreported.pop(seq, None)
        await _settle(msg.term() if terminate else msg.ack())
        await self.queue.emit(
            "dlq", job=spec.name, id=record["id"], attempts=record["attempts"],
            error_type=record["error"]["type"], error=record["error"]["message"],
        )  # fmt: skip

    async def _heartbeat(self) -> None:
        """Renew the ack wait of every job running for a third of it (one task for all)."""
        interval_s = self.spec.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for lease in list(self.running.values()):
                if now - lease.renewed_at >= interval_s:
                    lease.renewed_at = now
                    await _settle(lease.msg.in_progress())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        # Messages of earlier pull requests may still land and join `running` meanwhile.
        while self.running and (remaining := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self.running), timeout=remaining)
        leftovers = list(self.running)
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers)


async def _settle(reply: Coroutine[Any, Any, Any]) -> None:
    """Send an ack/nak/term/progress; if NATS is away the message is simply redelivered later."""
    try:
        await reply
    except NATS_ERRORS as exc:
        logger.debug("ack not sent (%s); the message will be redelivered", exc)


def _int_header(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
