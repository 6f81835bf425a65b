"""The `redis` bus driver: jobs on Redis Streams, for a team that runs Redis but not NATS.

Keys of a job, under `mega:jobs:<subject>`:
    <key>             the stream; one consumer group `mega_workers` shared by every worker
    <key>:scheduled   sorted set of delayed jobs and retries (score: due epoch ms)
    <key>:dlq         the dead-letter stream (records as on NATS, capped at DLQ_MAXLEN)
    <key>:dedup:<id>  a caller-given id seen within DEDUP_WINDOW_S (SET NX with a TTL)

An entry is acknowledged (XACK, then XDEL) only after its run: a worker that dies mid-job
leaves it pending in the group, and a live worker claims it (XAUTOCLAIM) once it has been idle
for the job's ack wait. So nothing is lost, unlike a list popped with BRPOP before the run. A
running job renews its claim every third of the ack wait (XCLAIM to itself). Attempts come
from the group's delivery count, plus the attempts of earlier entries of the same job: a retry
is moved to the sorted set with its attempt number and comes back as a new entry when due, so
it holds no slot while it waits. One Lua script promotes every due member (the "scheduled zset
promoter"), one enqueues with its dedup key, one dead-letters (DLQ record, ack and delete in
one step). `concurrency` caps the jobs each process runs at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from mega.context import Context
from mega.errors import DependencyUnavailable
from mega.jobs.consumer import MAX_ERROR_CHARS
from mega.jobs.delivery import DeadLetter, Outcome, Retry, decide, is_unreported
from mega.jobs.dlq import DlqRecord, make_record
from mega.jobs.job import HEADER_ENQUEUED_AT, Job, JobSpec, due_ms_of, encode_job
from mega.jobs.queue import DEDUP_WINDOW_S, JobQueue, JobStats

logger = logging.getLogger("mega.jobqueue")

KEY_PREFIX = "mega:jobs:"
GROUP = "mega_workers"
# Dead letters kept per job (oldest trimmed first); NATS keeps them by age instead.
DLQ_MAXLEN = 100_000
# How long one XREADGROUP waits for entries, and how often the promoter and the reclaimer run.
BLOCK_MS = 200
HOUSEKEEPING_S = 0.1
# A job cut off by the drain timeout is left pending: a live worker claims it after its ack wait.

# KEYS: stream, scheduled, dedup key (or ""); ARGV: id, body, enqueued_at, run_at, due (or ""),
# dedup ttl s. Returns 0 when the id was a duplicate.
ENQUEUE = """
if KEYS[3] ~= '' then
  if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[6]) then return 0 end
end
local fields = {'id', ARGV[1], 'body', ARGV[2], 'enqueued_at', ARGV[3], 'run_at', ARGV[4],
                'base', '0'}
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[5], cjson.encode(fields))
else
  redis.call('XADD', KEYS[1], '*', unpack(fields))
end
return 1
"""
# KEYS: stream, scheduled; ARGV: now ms, max members. Moves every due member into the stream.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, member in ipairs(due) do
  redis.call('XADD', KEYS[1], '*', unpack(cjson.decode(member)))
  redis.call('ZREM', KEYS[2], member)
end
return #due
"""
# KEYS: stream, scheduled; ARGV: entry id, due ms, fields as JSON. Ack + move to the zset.
RETRY = """
redis.call('XACK', KEYS[1], 'mega_workers', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
# KEYS: stream, dlq; ARGV: entry id, record JSON, dlq maxlen. Record, ack and delete at once.
BURY = """
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'record', ARGV[2])
redis.call('XACK', KEYS[1], 'mega_workers', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
"""


def _key(spec: JobSpec) -> str:
    return KEY_PREFIX + spec.subject


class RedisJobQueue(JobQueue):
    """JobQueue on a redis bus: see the module's docstring."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        native: Any = ctx.bus(bus_alias).native
        self.redis: Redis = native
        self.consumer_name = f"{self.instance_id}:{uuid.uuid4().hex[:6]}"
        self._ensured: set[type[Job]] = set()
        self._running: dict[asyncio.Task[None], tuple[str, float]] = {}
        self._stopping = False
        # Finished entries waiting for their XACK + XDEL, sent in batches (one round trip for
        # many jobs: what lets a worker keep up with a bare loop that acks one by one).
        self._acks: dict[str, list[Any]] = {}
        self._acks_waiting = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._scripts = {
            name: self.redis.register_script(source)
            for name, source in (
                ("enqueue", ENQUEUE), ("promote", PROMOTE), ("retry", RETRY), ("bury", BURY),
            )
        }  # fmt: skip

    @property
    def dlq(self) -> RedisDeadLetters:
        return RedisDeadLetters(self)

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        spec = self.spec(job_cls)
        if job_cls in self._ensured and not force:
            return spec
        try:
            await self.redis.xgroup_create(_key(spec), GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # it exists already: fine
                raise
        except (RedisError, OSError) as exc:
            message = f"{spec.name}: cannot set up its stream: {exc}"
            raise DependencyUnavailable("redis", message) from exc
        self._ensured.add(job_cls)
        return spec

    async def stats(self, job_cls: type[Job]) -> JobStats:
        spec = await self.ensure(job_cls)
        key = _key(spec)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(key)
            pipe.xpending(key, GROUP)
            pipe.zcard(key + ":scheduled")
            pipe.xlen(key + ":dlq")
            length, pending, scheduled, dead = await pipe.execute()
        in_flight = int(pending["pending"])
        return JobStats(pending=length - in_flight + scheduled, in_flight=in_flight, dlq=dead)

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
        spec = await self.ensure(job_cls)
        due_ms = due_ms_of(spec, delay, run_at)
        job_id, _, body, headers = encode_job(spec, payload, job_id=id)
        now_ms = int(headers[HEADER_ENQUEUED_AT])
        due = due_ms if due_ms is not None and due_ms > now_ms else now_ms
        key = _key(spec)
        try:
            added = await self._scripts["enqueue"](
                keys=[key, key + ":scheduled", f"{key}:dedup:{id}" if id else ""],
                args=[
                    job_id, body, now_ms, due, due if due > now_ms else "", int(DEDUP_WINDOW_S),
                ],
            )  # fmt: skip
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable("redis", f"cannot enqueue {spec.name}: {exc}") from exc
        await self.signal("dispatch", job=spec.name, id=job_id, subject=spec.subject,
                          duplicate=not added)  # fmt: skip
        return job_id

    async def enqueue_many(self, job_cls: type[Job], payloads: Iterable[Any]) -> list[str]:
        spec = await self.ensure(job_cls)
        envelopes = [encode_job(spec, payload) for payload in payloads]  # all checked first
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id, _, body, headers in envelopes:
                    now = headers[HEADER_ENQUEUED_AT]
                    pipe.xadd(_key(spec), {"id": job_id, "body": body, "enqueued_at": now,
                                           "run_at": now, "base": 0})  # fmt: skip
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable("redis", f"cannot enqueue {spec.name}: {exc}") from exc
        return [job_id for job_id, *_ in envelopes]

    # -- consume ------------------------------------------------------------------------------

    async def consume(self, job_cls: type[Job], handler_ctx: Context | None = None) -> None:
        spec = await self.ensure(job_cls)
        job, ctx, key = spec.job_cls(), handler_ctx or self.ctx, _key(spec)
        ack_wait_ms = int(spec.ack_wait_s * 1000)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_acks_forever())
        housekeeping_at = 0.0
        warned = ""
        while not self._stopping:
            try:
                now = time.monotonic()
                if now >= housekeeping_at:
                    housekeeping_at = now + HOUSEKEEPING_S
                    await self._scripts["promote"](
                        keys=[key, key + ":scheduled"], args=[int(time.time() * 1000), 1000]
                    )
                    await self._reclaim(spec, job, ctx, ack_wait_ms)
                free = spec.concurrency - len(self._running)
                if free <= 0:
                    await asyncio.sleep(0.005)
                    continue
                answer: Any = await self.redis.xreadgroup(
                    GROUP, self.consumer_name, {key: ">"}, count=free, block=BLOCK_MS
                )
                for _, entries in answer or []:
                    for entry_id, fields in entries:
                        self._start(spec, job, ctx, entry_id, fields, deliveries=1)
                warned = ""
            except (RedisError, OSError) as exc:  # an outage: wait it out, never die
                if str(exc) != warned:
                    logger.warning("%s: Redis unavailable (%s); retrying", spec.name, exc)
                    warned = str(exc)
                with contextlib.suppress(RedisError, OSError):
                    await self.ensure(job_cls, force=True)  # a Redis restarted empty
                await asyncio.sleep(0.25)

    async def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        running = list(self._running)
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        for task in list(self._running):
            task.cancel()  # left pending in the group: claimed by a live worker after the ack wait
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*running, return_exceptions=True)
        if self._flusher is not None:
            # Woken to see `_stopping`, not cancelled: a cancelled flusher was seen not to end
            # (the benchmark's stop() then waited forever).
            self._acks_waiting.set()
            await self._flusher
        with contextlib.suppress(RedisError, OSError):
            await self._flush_acks()  # the finished jobs' acks leave before we return

    async def _flush_acks_forever(self) -> None:
        while not self._stopping:
            await self._acks_waiting.wait()
            self._acks_waiting.clear()
            try:
                await self._flush_acks()
            except (RedisError, OSError) as exc:  # unacked: reclaimed and run again later
                logger.warning("acks not sent (%s); those jobs may run again", exc)

    async def _flush_acks(self) -> None:
        batches, self._acks = self._acks, {}
        if not batches:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, entry_ids in batches.items():
                pipe.xack(key, GROUP, *entry_ids)
                pipe.xdel(key, *entry_ids)
            await pipe.execute()

    async def _reclaim(self, spec: JobSpec, job: Job, ctx: Context, ack_wait_ms: int) -> None:
        """Claim entries idle for the ack wait (their worker died) and run them."""
        free = spec.concurrency - len(self._running)
        if free <= 0:
            return
        key = _key(spec)
        _, claimed, *_ = await self.redis.xautoclaim(
            key, GROUP, self.consumer_name, ack_wait_ms, "0-0", count=free
        )
        if not claimed:
            return
        details = await self.redis.xpending_range(
            key, GROUP, min=claimed[0][0], max=claimed[-1][0], count=len(claimed)
        )
        deliveries = {d["message_id"]: int(d["times_delivered"]) for d in details}
        for entry_id, fields in claimed:
            if fields:  # an entry deleted meanwhile comes back empty
                self._start(spec, job, ctx, entry_id, fields, deliveries.get(entry_id, 2))

    def _start(
        self, spec: JobSpec, job: Job, ctx: Context, entry_id: Any, fields: dict[Any, Any],
        deliveries: int,
    ) -> None:  # fmt: skip
        task = asyncio.create_task(self._process(spec, job, ctx, entry_id, fields, deliveries))
        self._running[task] = (str(entry_id), time.monotonic())
        task.add_done_callback(self._running.pop)

    async def _process(
        self, spec: JobSpec, job: Job, ctx: Context, entry_id: Any, fields: dict[Any, Any],
        deliveries: int,
    ) -> None:  # fmt: skip
        get = {_text(k): v for k, v in fields.items()}
        job_id, enqueued_at = _text(get["id"]), int(get["enqueued_at"])
        attempt = int(get.get("base", 0)) + deliveries
        key = _key(spec)
        payload = json.loads(get["body"])
        if is_unreported(attempt, spec):
            message = (
                f"attempt {attempt - 1} of {spec.max_attempts} never reported back: its worker "
                "died (crash, os._exit, OOM kill)"
            )
            await self.signal("fail", job=spec.name, id=job_id, attempt=attempt, phase="run",
                              error_type="WorkerCrashed", error=message)  # fmt: skip
            await self._bury(spec, entry_id, job_id, payload, "WorkerCrashed", message,
                             attempt - 1, enqueued_at)  # fmt: skip
            return
        started = time.time()
        latency_ms = max(0, round(started * 1000) - int(get["run_at"]))
        await self.signal("start", job=spec.name, id=job_id, attempt=attempt, latency_ms=latency_ms)
        renew = asyncio.create_task(self._renew(key, entry_id, spec.ack_wait_s / 3))
        try:
            await job.run(payload, ctx)
        except asyncio.CancelledError:
            raise  # the drain's timeout: left pending, claimed by a live worker later
        except Exception as exc:
            await self._failed(spec, entry_id, get, payload, attempt, started, exc)
            return
        finally:
            renew.cancel()
        self._acks.setdefault(key, []).append(entry_id)
        self._acks_waiting.set()
        await self.signal("done", job=spec.name, id=job_id, attempt=attempt,
                          duration_ms=round((time.time() - started) * 1000, 3))  # fmt: skip

    async def _failed(
        self, spec: JobSpec, entry_id: Any, get: dict[str, Any], payload: Any, attempt: int,
        started: float, exc: Exception,
    ) -> None:  # fmt: skip
        job_id, key = _text(get["id"]), _key(spec)
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        fields = {"job": spec.name, "id": job_id, "attempt": attempt,
                  "duration_ms": round((time.time() - started) * 1000, 3)}  # fmt: skip
        decision = decide(Outcome.FAILED, attempt, spec)
        if isinstance(decision, Retry):
            due = int(time.time() * 1000) + decision.delay_ms
            member = [
                "id", job_id, "body", _text(get["body"]), "enqueued_at",
                _text(get["enqueued_at"]), "run_at", str(due), "base", str(attempt),
            ]  # fmt: skip
            await self._scripts["retry"](
                keys=[key, key + ":scheduled"], args=[entry_id, due, json.dumps(member)]
            )
            await self.signal("retry", **fields, delay_ms=decision.delay_ms,
                              error_type=error_type, error=error)  # fmt: skip
            return
        assert isinstance(decision, DeadLetter)
        await self.signal("fail", **fields, phase="run", error_type=error_type, error=error)
        await self._bury(spec, entry_id, job_id, payload, error_type, error, attempt,
                         int(get["enqueued_at"]))  # fmt: skip

    async def _bury(
        self, spec: JobSpec, entry_id: Any, job_id: str, payload: Any, error_type: str,
        error: str, attempts: int, enqueued_at: int,
    ) -> None:  # fmt: skip
        record = make_record(
            spec.subject, job_id, payload, error_type, error, attempts=attempts,
            first_enqueued_at=enqueued_at, worker=self.instance_id,
        )  # fmt: skip
        key = _key(spec)
        await self._scripts["bury"](
            keys=[key, key + ":dlq"], args=[entry_id, json.dumps(record), DLQ_MAXLEN]
        )
        await self.signal("dlq", job=spec.name, id=job_id, attempts=attempts,
                          error_type=error_type, error=error)  # fmt: skip

    async def _renew(self, key: str, entry_id: Any, every_s: float) -> None:
        """Keep a long job's claim fresh, so no peer reclaims it while it runs."""
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(RedisError, OSError):
                await self.redis.xclaim(key, GROUP, self.consumer_name, 0, [entry_id], justid=True)


class RedisDeadLetters:
    """The DLQ tools of a redis queue (the same calls as DeadLetters on NATS)."""

    def __init__(self, queue: RedisJobQueue) -> None:
        self.queue = queue

    async def _key(self, job_cls: type[Any]) -> tuple[JobSpec, str]:
        spec = await self.queue.ensure(job_cls)
        return spec, _key(spec) + ":dlq"

    async def count(self, job_cls: type[Any]) -> int:
        _, key = await self._key(job_cls)
        return int(await self.queue.redis.xlen(key))

    async def list(self, job_cls: type[Any], limit: int = 50) -> list[DlqRecord]:
        _, key = await self._key(job_cls)
        entries: Any = await self.queue.redis.xrevrange(key, count=limit)
        return [_record(entry_id, fields) for entry_id, fields in entries]

    async def requeue(self, job_cls: type[Any], job_id: str) -> int:
        return await self._requeue(job_cls, job_id)

    async def requeue_all(self, job_cls: type[Any]) -> int:
        return await self._requeue(job_cls, None)

    async def purge(self, job_cls: type[Any]) -> int:
        _, key = await self._key(job_cls)
        count = int(await self.queue.redis.xlen(key))
        await self.queue.redis.delete(key)
        return count

    async def _requeue(self, job_cls: type[Any], job_id: str | None) -> int:
        spec, key = await self._key(job_cls)
        redis, requeued = self.queue.redis, 0
        entries: Any = await redis.xrange(key)
        for entry_id, fields in entries:
            record = _record(entry_id, fields)
            if job_id is not None and record["id"] != job_id:
                continue
            now = int(time.time() * 1000)
            body = json.dumps(record["payload"], separators=(",", ":"))
            enqueued = record.get("first_enqueued_at") or now
            async with redis.pipeline(transaction=True) as pipe:
                # A new entry with no earlier attempts: that is the attempt reset.
                fields = {
                    "id": record["id"], "body": body, "enqueued_at": enqueued, "run_at": now,
                    "base": 0,
                }  # fmt: skip
                pipe.xadd(_key(spec), fields)
                pipe.xdel(key, entry_id)
                await pipe.execute()
            requeued += 1
        return requeued


def _record(entry_id: Any, fields: dict[Any, Any]) -> DlqRecord:
    raw: Any = fields.get(b"record", fields.get("record"))
    record: DlqRecord = json.loads(raw)
    record["seq"] = int(_text(entry_id).split("-")[0])
    return record


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


JobQueue.drivers["redis"] = RedisJobQueue
