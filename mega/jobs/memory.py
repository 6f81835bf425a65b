"""The `memory` bus driver: jobs in this process, for unit tests and for trying mega without
servers. The same Job classes, the same signals, retries with the same backoff and decisions
(`delivery.decide`), delayed jobs, dedup ids, a dead-letter queue with the same records and
tools, and a bounded drain. What it cannot have: durability. Everything enqueued lives and dies
with the process, and only this process can consume it (a host on a memory bus says so at
start). Never a stand-in for a real bus in production.

    services = {"buses": {"jobs": {"driver": "memory"}}}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mega.context import Context
from mega.errors import JobError
from mega.jobs.consumer import MAX_ERROR_CHARS
from mega.jobs.delivery import DeadLetter, LaneSpec, Outcome, Retry, decide
from mega.jobs.dlq import DlqRecord, make_record
from mega.jobs.job import HEADER_ENQUEUED_AT, Job, JobSpec, due_ms_of, encode_job
from mega.jobs.queue import DEDUP_WINDOW_S, DLQ_RETRY_DELAY_S, JobQueue, JobStats

# Events a memory bus keeps for listener groups that start later (the oldest go first).
EVENTS_KEPT = 100_000


@dataclass
class MemoryMessage:
    job_id: str
    subject: str  # what it was published on (a job's subject, `events.<name>`)
    body: bytes
    enqueued_at_ms: int
    run_at_ms: int
    deliveries: int = 0
    # A dead letter whose write failed: kept with the message, which comes back later to write
    # it again rather than run again (the memory twin of a nacked DLQ publish on NATS).
    dead_record: DlqRecord | None = None


@dataclass
class MemoryLane:
    """One lane's queue (a job subject's, a listener group's): ready messages, scheduled ones,
    dead letters."""

    ready: deque[MemoryMessage] = field(default_factory=deque)
    scheduled: int = 0  # delayed jobs and retries waiting for their time
    running: int = 0
    dead: list[DlqRecord] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = 0
    timers: dict[asyncio.TimerHandle, Callable[[], None]] = field(default_factory=dict)

    def stats(self) -> JobStats:
        return JobStats(
            pending=len(self.ready) + self.scheduled, in_flight=self.running, dlq=len(self.dead)
        )

    def put(self, message: MemoryMessage, *, at_ms: int | None = None) -> None:
        """Ready now, or at `at_ms` (epoch ms) without holding anything while it waits."""
        delay_s = 0.0 if at_ms is None else (at_ms - time.time() * 1000) / 1000
        if delay_s <= 0:
            self._ready(message)
            return
        self.scheduled += 1

        def due() -> None:
            del self.timers[handle]
            self.scheduled -= 1
            self._ready(message)

        handle = asyncio.get_running_loop().call_later(delay_s, due)
        self.timers[handle] = due

    def dead_letter(self, record: DlqRecord) -> None:
        """Keep a dead letter: the DLQ publish of the other drivers (mega.testing's
        failing_dlq makes it raise, to test what a failed publish does)."""
        self.seq += 1
        record["seq"] = self.seq
        self.dead.append(record)

    def fast_forward(self) -> None:
        """Make every waiting message due now (mega.testing's drain: no real sleeps)."""
        for handle, due in list(self.timers.items()):
            handle.cancel()
            due()

    @property
    def busy(self) -> bool:
        return bool(self.ready or self.scheduled or self.running)

    def _ready(self, message: MemoryMessage) -> None:
        self.ready.append(message)
        self.wakeup.set()


class MemoryBroker:
    """What a `memory` bus holds (`ctx.bus(alias).native`): the queues of its job subjects and
    listener groups, and the events log new groups replay."""

    def __init__(self) -> None:
        self.subjects: dict[str, MemoryLane] = {}
        self.dedup: dict[str, float] = {}  # job id -> when it leaves the dedup window (monotonic)
        # Emitted events (subject, id, body, emitted at ms), oldest first, for groups to come.
        self.events: deque[tuple[str, str, bytes, int]] = deque(maxlen=EVENTS_KEPT)
        # Listener groups: group -> (its pattern's test of a subject, the name of its queue).
        self.groups: dict[str, tuple[Callable[[str], bool], str]] = {}

    def subject(self, name: str) -> MemoryLane:
        found = self.subjects.get(name)
        if found is None:
            found = self.subjects[name] = MemoryLane()
        return found

    def busy(self) -> bool:
        """Anything ready, running or waiting for its time, on any lane."""
        return any(lane.busy for lane in self.subjects.values())

    def fast_forward(self) -> None:
        """Make every waiting retry and delayed message due now."""
        for lane in self.subjects.values():
            lane.fast_forward()

    def seen(self, job_id: str) -> bool:
        """True when this id was enqueued within the dedup window (then it is dropped)."""
        now = time.monotonic()
        expires = self.dedup.get(job_id)
        if expires is not None and expires > now:
            return True
        self.dedup[job_id] = now + DEDUP_WINDOW_S
        if len(self.dedup) > 100_000:  # bounded: forget what left the window
            self.dedup = {key: when for key, when in self.dedup.items() if when > now}
        return False


Handler = Callable[[Any, MemoryMessage, int], Awaitable[None]]  # (payload, message, attempt)


class MemoryConsumer:
    """The consume loops of one process on a memory bus: a lane is a `MemoryLane` and the spec
    of what runs there (a JobSpec, a ListenerSpec). Retries, backoff and dead letters follow
    `delivery.decide`, as on every driver."""

    def __init__(self, instance_id: str, signal: Callable[..., Awaitable[None]]) -> None:
        self.instance_id = instance_id
        self.signal = signal
        self._queues: list[MemoryLane] = []
        self._running: dict[asyncio.Task[None], tuple[MemoryLane, MemoryMessage]] = {}
        self._stopping = False

    async def run(self, spec: LaneSpec, queue: MemoryLane, handler: Handler) -> None:
        self._queues.append(queue)
        while not self._stopping:
            while queue.ready and queue.running < spec.concurrency and not self._stopping:
                message = queue.ready.popleft()
                queue.running += 1
                task = asyncio.create_task(self._process(spec, queue, handler, message))
                self._running[task] = (queue, message)
                task.add_done_callback(self._running.pop)
            queue.wakeup.clear()
            if not self._stopping:
                await queue.wakeup.wait()

    async def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        for queue in self._queues:
            queue.wakeup.set()
        running = list(self._running)
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        for task in list(self._running):
            queue, message = self._running[task]
            task.cancel()
            queue.ready.appendleft(message)  # handed back: the next consumer gets it first
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*running, return_exceptions=True)

    async def _process(
        self, spec: LaneSpec, queue: MemoryLane, handler: Handler, message: MemoryMessage
    ) -> None:
        message.deliveries += 1
        attempt = message.deliveries
        try:
            if message.dead_record is not None:
                await self._dead_letter(spec, queue, message, message.dead_record)
                return
            payload = json.loads(message.body)
            started = time.time()
            latency_ms = max(0, round(started * 1000) - message.run_at_ms)
            await self.signal(
                "start", job=spec.name, id=message.job_id, attempt=attempt, latency_ms=latency_ms
            )
            try:
                await handler(payload, message, attempt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._failed(spec, queue, message, payload, attempt, started, exc)
                return
            await self.signal("done", job=spec.name, id=message.job_id, attempt=attempt,
                              duration_ms=round((time.time() - started) * 1000, 3))  # fmt: skip
        finally:
            queue.running -= 1
            queue.wakeup.set()

    async def _failed(
        self, spec: LaneSpec, queue: MemoryLane, message: MemoryMessage, payload: Any, attempt: int,
        started: float, exc: Exception,
    ) -> None:  # fmt: skip
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        fields = {"job": spec.name, "id": message.job_id, "attempt": attempt,
                  "duration_ms": round((time.time() - started) * 1000, 3)}  # fmt: skip
        decision = decide(Outcome.FAILED, attempt, spec)
        if isinstance(decision, Retry):
            message.run_at_ms = int(time.time() * 1000) + decision.delay_ms
            queue.put(message, at_ms=message.run_at_ms)
            await self.signal("retry", **fields, delay_ms=decision.delay_ms,
                              run_at=message.run_at_ms, error_type=error_type,
                              error=error)  # fmt: skip
            return
        assert isinstance(decision, DeadLetter)
        await self.signal("fail", **fields, phase="run", error_type=error_type, error=error)
        record = make_record(
            message.subject, message.job_id, payload, error_type, error, attempts=attempt,
            first_enqueued_at=message.enqueued_at_ms, worker=self.instance_id,
        )  # fmt: skip
        await self._dead_letter(spec, queue, message, record)

    async def _dead_letter(
        self, spec: LaneSpec, queue: MemoryLane, message: MemoryMessage, record: DlqRecord
    ) -> None:
        """Keep the record; if that fails the message comes back after a delay to try again,
        so nothing is lost (as on NATS, where the original is nacked until the PubAck)."""
        try:
            queue.dead_letter(record)
        except Exception as exc:
            message.dead_record = record
            queue.put(message, at_ms=int((time.time() + DLQ_RETRY_DELAY_S) * 1000))
            await self.signal("fail", job=spec.name, id=message.job_id, attempt=record["attempts"],
                              phase="dlq_publish", error_type=type(exc).__name__,
                              error=str(exc)[:MAX_ERROR_CHARS])  # fmt: skip
            return
        message.dead_record = None
        error = record["error"]
        await self.signal("dlq", job=spec.name, id=message.job_id, attempts=record["attempts"],
                          error_type=error["type"], error=error["message"])  # fmt: skip


class MemoryJobQueue(JobQueue):
    """JobQueue on a memory bus: see the module's docstring."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        self.broker = memory_broker(ctx, bus_alias)
        self.consumer = MemoryConsumer(self.instance_id, self.signal)

    @property
    def dlq(self) -> MemoryDeadLetters:
        return MemoryDeadLetters(self._queue)

    async def _queue(self, job_cls: type[Any]) -> MemoryLane:
        return self.broker.subject((await self.ensure(job_cls)).subject)

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        spec = self.spec(job_cls)
        self.broker.subject(spec.subject)
        return spec

    async def stats(self, job_cls: type[Job]) -> JobStats:
        return (await self._queue(job_cls)).stats()

    async def enqueue(
        self,
        job_cls: type[Job],
        payload: Any,
        *,
        id: str | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
    ) -> str:
        spec = await self.ensure(job_cls)
        due_ms = due_ms_of(spec, delay, run_at)
        job_id, _, body, headers = encode_job(spec, payload, job_id=id)
        duplicate = id is not None and self.broker.seen(id)
        if not duplicate:
            now_ms = int(headers[HEADER_ENQUEUED_AT])
            due = max(now_ms, due_ms or now_ms)
            message = MemoryMessage(job_id, spec.subject, body, now_ms, due)
            self.broker.subject(spec.subject).put(message, at_ms=due_ms)
        await self.signal("dispatch", job=spec.name, id=job_id, subject=spec.subject,
                          duplicate=duplicate)  # fmt: skip
        return job_id

    async def enqueue_many(self, job_cls: type[Job], payloads: Iterable[Any]) -> list[str]:
        spec = await self.ensure(job_cls)
        envelopes = [encode_job(spec, payload) for payload in payloads]  # all checked first
        queue = self.broker.subject(spec.subject)
        for job_id, _, body, headers in envelopes:
            now_ms = int(headers[HEADER_ENQUEUED_AT])
            queue.put(MemoryMessage(job_id, spec.subject, body, now_ms, now_ms))
        return [job_id for job_id, *_ in envelopes]

    async def consume(self, job_cls: type[Job], handler_ctx: Context | None = None) -> None:
        spec = await self.ensure(job_cls)
        run = self._runner(spec, handler_ctx, job_id_of)
        await self.consumer.run(spec, self.broker.subject(spec.subject), run)

    async def stop(self, timeout_s: float = 30.0) -> None:
        await self.consumer.stop(timeout_s)


def job_id_of(message: MemoryMessage) -> str:
    return message.job_id


def memory_broker(ctx: Context, bus_alias: str) -> MemoryBroker:
    broker = ctx.bus(bus_alias).native
    if not isinstance(broker, MemoryBroker):
        raise JobError(f"bus {bus_alias!r} is not a memory bus", code="job.driver")
    return broker


class MemoryDeadLetters:
    """The DLQ tools of memory lanes (the same calls as DeadLetters on NATS); `locate(cls)`
    gives the queue of a Job or Listener class."""

    def __init__(self, locate: Callable[[type[Any]], Awaitable[MemoryLane]]) -> None:
        self.locate = locate

    async def count(self, cls: type[Any]) -> int:
        return len((await self.locate(cls)).dead)

    async def list(self, cls: type[Any], limit: int = 50) -> list[DlqRecord]:
        return list(reversed((await self.locate(cls)).dead))[:limit]

    async def requeue(self, cls: type[Any], job_id: str) -> int:
        return await self._requeue(cls, job_id)

    async def requeue_all(self, cls: type[Any]) -> int:
        return await self._requeue(cls, None)

    async def purge(self, cls: type[Any]) -> int:
        dead = (await self.locate(cls)).dead
        count = len(dead)
        dead.clear()
        return count

    async def _requeue(self, cls: type[Any], job_id: str | None) -> int:
        queue = await self.locate(cls)
        chosen = [r for r in queue.dead if job_id is None or r["id"] == job_id]
        for record in chosen:
            queue.dead.remove(record)
            body = json.dumps(record["payload"], separators=(",", ":")).encode()
            now_ms = int(time.time() * 1000)
            enqueued = record.get("first_enqueued_at") or now_ms
            # A new message: its deliveries (the attempts) start again at 1.
            queue.put(MemoryMessage(record["id"], record["subject"], body, enqueued, now_ms))
        return len(chosen)


JobQueue.drivers["memory"] = MemoryJobQueue
