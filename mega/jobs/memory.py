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
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mega.context import Context
from mega.errors import JobError
from mega.jobs.consumer import MAX_ERROR_CHARS
from mega.jobs.delivery import DeadLetter, Outcome, Retry, decide
from mega.jobs.dlq import DlqRecord, make_record
from mega.jobs.job import HEADER_ENQUEUED_AT, Job, JobSpec, due_ms_of, encode_job
from mega.jobs.queue import DEDUP_WINDOW_S, JobQueue, JobStats


@dataclass
class _Message:
    job_id: str
    body: bytes
    enqueued_at_ms: int
    run_at_ms: int
    deliveries: int = 0


@dataclass
class _Subject:
    """One job subject's queue: ready messages, scheduled ones, dead letters."""

    ready: deque[_Message] = field(default_factory=deque)
    scheduled: int = 0  # delayed jobs and retries waiting for their time
    running: int = 0
    dead: list[DlqRecord] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = 0


class MemoryBroker:
    """What a `memory` bus holds (`ctx.bus(alias).native`): the queues of its job subjects."""

    def __init__(self) -> None:
        self.subjects: dict[str, _Subject] = {}
        self.dedup: dict[str, float] = {}  # job id -> when it leaves the dedup window (monotonic)

    def subject(self, name: str) -> _Subject:
        found = self.subjects.get(name)
        if found is None:
            found = self.subjects[name] = _Subject()
        return found

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


class MemoryJobQueue(JobQueue):
    """JobQueue on a memory bus: see the module's docstring."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        broker = ctx.bus(bus_alias).native
        if not isinstance(broker, MemoryBroker):
            raise JobError(f"bus {bus_alias!r} is not a memory bus", code="job.driver")
        self.broker = broker
        self._running: dict[asyncio.Task[None], tuple[_Subject, _Message]] = {}
        self._stopping = False

    @property
    def dlq(self) -> MemoryDeadLetters:
        return MemoryDeadLetters(self)

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        spec = self.spec(job_cls)
        self.broker.subject(spec.subject)
        return spec

    async def stats(self, job_cls: type[Job]) -> JobStats:
        queue = self.broker.subject((await self.ensure(job_cls)).subject)
        return JobStats(
            pending=len(queue.ready) + queue.scheduled, in_flight=queue.running,
            dlq=len(queue.dead),
        )  # fmt: skip

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
            message = _Message(job_id, body, now_ms, max(now_ms, due_ms or now_ms))
            self._put(spec, message, at_ms=due_ms)
        await self.signal("dispatch", job=spec.name, id=job_id, subject=spec.subject,
                          duplicate=duplicate)  # fmt: skip
        return job_id

    async def enqueue_many(self, job_cls: type[Job], payloads: Iterable[Any]) -> list[str]:
        spec = await self.ensure(job_cls)
        envelopes = [encode_job(spec, payload) for payload in payloads]  # all checked first
        for job_id, _, body, headers in envelopes:
            now_ms = int(headers[HEADER_ENQUEUED_AT])
            self._put(spec, _Message(job_id, body, now_ms, now_ms))
        return [job_id for job_id, *_ in envelopes]

    async def consume(self, job_cls: type[Job], handler_ctx: Context | None = None) -> None:
        spec = await self.ensure(job_cls)
        queue = self.broker.subject(spec.subject)
        job, ctx = spec.job_cls(), handler_ctx or self.ctx
        while not self._stopping:
            while queue.ready and queue.running < spec.concurrency and not self._stopping:
                message = queue.ready.popleft()
                queue.running += 1
                task = asyncio.create_task(self._process(spec, queue, job, ctx, message))
                self._running[task] = (queue, message)
                task.add_done_callback(self._running.pop)
            queue.wakeup.clear()
            if not self._stopping:
                await queue.wakeup.wait()

    async def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        for queue in self.broker.subjects.values():
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

    # -- running ----------------------------------------------------------------------------

    async def _process(
        self, spec: JobSpec, queue: _Subject, job: Job, ctx: Context, message: _Message
    ) -> None:
        message.deliveries += 1
        attempt = message.deliveries
        try:
            payload = json.loads(message.body)
            started = time.time()
            latency_ms = max(0, round(started * 1000) - message.run_at_ms)
            await self.signal(
                "start", job=spec.name, id=message.job_id, attempt=attempt, latency_ms=latency_ms
            )
            try:
                await job.run(payload, ctx)
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
        self, spec: JobSpec, queue: _Subject, message: _Message, payload: Any, attempt: int,
        started: float, exc: Exception,
    ) -> None:  # fmt: skip
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        fields = {"job": spec.name, "id": message.job_id, "attempt": attempt,
                  "duration_ms": round((time.time() - started) * 1000, 3)}  # fmt: skip
        decision = decide(Outcome.FAILED, attempt, spec)
        if isinstance(decision, Retry):
            message.run_at_ms = int(time.time() * 1000) + decision.delay_ms
            self._put(spec, message, at_ms=message.run_at_ms)
            await self.signal("retry", **fields, delay_ms=decision.delay_ms,
                              error_type=error_type, error=error)  # fmt: skip
            return
        assert isinstance(decision, DeadLetter)
        await self.signal("fail", **fields, phase="run", error_type=error_type, error=error)
        queue.seq += 1
        record = make_record(
            spec.subject, message.job_id, payload, error_type, error, attempts=attempt,
            first_enqueued_at=message.enqueued_at_ms, worker=self.instance_id,
        )  # fmt: skip
        record["seq"] = queue.seq
        queue.dead.append(record)
        await self.signal("dlq", job=spec.name, id=message.job_id, attempts=attempt,
                          error_type=error_type, error=error)  # fmt: skip

    def _put(self, spec: JobSpec, message: _Message, *, at_ms: int | None = None) -> None:
        queue = self.broker.subject(spec.subject)
        delay_s = 0.0 if at_ms is None else (at_ms - time.time() * 1000) / 1000
        if delay_s <= 0:
            queue.ready.append(message)
            queue.wakeup.set()
            return
        queue.scheduled += 1

        def due() -> None:
            queue.scheduled -= 1
            queue.ready.append(message)
            queue.wakeup.set()

        asyncio.get_running_loop().call_later(delay_s, due)


class MemoryDeadLetters:
    """The DLQ tools of a memory queue (the same calls as DeadLetters on NATS)."""

    def __init__(self, queue: MemoryJobQueue) -> None:
        self.queue = queue

    async def _dead(self, job_cls: type[Any]) -> tuple[JobSpec, list[DlqRecord]]:
        spec = await self.queue.ensure(job_cls)
        return spec, self.queue.broker.subject(spec.subject).dead

    async def count(self, job_cls: type[Any]) -> int:
        return len((await self._dead(job_cls))[1])

    async def list(self, job_cls: type[Any], limit: int = 50) -> list[DlqRecord]:
        return list(reversed((await self._dead(job_cls))[1]))[:limit]

    async def requeue(self, job_cls: type[Any], job_id: str) -> int:
        return await self._requeue(job_cls, job_id)

    async def requeue_all(self, job_cls: type[Any]) -> int:
        return await self._requeue(job_cls, None)

    async def purge(self, job_cls: type[Any]) -> int:
        _, dead = await self._dead(job_cls)
        count = len(dead)
        dead.clear()
        return count

    async def _requeue(self, job_cls: type[Any], job_id: str | None) -> int:
        spec, dead = await self._dead(job_cls)
        chosen = [r for r in dead if job_id is None or r["id"] == job_id]
        for record in chosen:
            dead.remove(record)
            body = json.dumps(record["payload"], separators=(",", ":")).encode()
            now_ms = int(time.time() * 1000)
            enqueued = record.get("first_enqueued_at") or now_ms
            # A new message: its deliveries (the attempts) start again at 1.
            self.queue._put(spec, _Message(record["id"], body, enqueued, now_ms))
        return len(chosen)


JobQueue.drivers["memory"] = MemoryJobQueue
