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

The consume loop itself is `RedisConsumer`, which runs lanes: a job's keys here, a listener
group's in mega/events/redis_bus.py (the same retries, claims and dead letters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from mega.context import Context
from mega.errors import DependencyUnavailable
from mega.jobs.consumer import MAX_ERROR_CHARS
from mega.jobs.delivery import DeadLetter, LaneSpec, Outcome, Retry, decide, is_unreported
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
# KEYS: stream, scheduled; ARGV: entry id, due ms, fields as JSON, group, delete (1|0).
# Ack (and delete, unless other groups read the stream too) + move to the zset.
RETRY = """
redis.call('XACK', KEYS[1], ARGV[4], ARGV[1])
if ARGV[5] == '1' then redis.call('XDEL', KEYS[1], ARGV[1]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
# KEYS: stream, dlq; ARGV: entry id, record JSON, dlq maxlen, group, delete (1|0).
# Record, ack and delete at once.
BURY = """
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'record', ARGV[2])
redis.call('XACK', KEYS[1], ARGV[4], ARGV[1])
if ARGV[5] == '1' then redis.call('XDEL', KEYS[1], ARGV[1]) end
return 1
"""

Fields = dict[str, Any]  # an entry's fields, names decoded, values as Redis returned them
Handler = Callable[[Any, Fields, int], Awaitable[None]]  # (payload, fields, attempt)
Signal = Callable[..., Awaitable[None]]


@dataclass(frozen=True)
class Lane:
    """The keys one consume loop works on: a job's, or a listener group's.

    `stream` is read all the time; when `shared`, other consumer groups read it too (the events
    log), so its entries are acknowledged and never deleted. `own` is where this lane's retries
    come back and its DLQ requeues go (a job's own stream; a listener group's side stream, read
    at each housekeeping round). `accepts`, when given, picks the entries to run; the others are
    acknowledged untouched (a group's event pattern)."""

    spec: LaneSpec
    group: str
    stream: str
    own: str
    scheduled: str
    dlq: str
    record_subject: Callable[[Fields], str]
    shared: bool = False
    accepts: Callable[[Fields], bool] | None = None

    def deletes(self, stream: str) -> bool:
        return not (self.shared and stream == self.stream)


def job_lane(spec: JobSpec) -> Lane:
    key = KEY_PREFIX + spec.subject
    return Lane(
        spec=spec, group=GROUP, stream=key, own=key, scheduled=key + ":scheduled",
        dlq=key + ":dlq", record_subject=lambda fields: spec.subject,
    )  # fmt: skip


class RedisConsumer:
    """The consume loops of one process on one Redis: reading, claiming, promoting, retrying,
    dead-lettering, and the finished entries' acks sent in batches. `run(lane, handler)` runs
    one lane until `stop()`; `signal(name, **fields)` reports each step (fields name the lane
    `job`)."""

    def __init__(self, redis: Redis, instance_id: str, signal: Signal) -> None:
        self.redis = redis
        self.instance_id = instance_id
        self.signal = signal
        self.consumer_name = f"{instance_id}:{uuid.uuid4().hex[:6]}"
        self._running: dict[asyncio.Task[None], str] = {}  # task -> its lane's dlq key
        self._busy: dict[str, int] = {}  # lane (dlq key) -> entries running
        self._stopping = False
        # Finished entries waiting for their XACK (+ XDEL), sent in batches (one round trip for
        # many jobs: what lets a worker keep up with a bare loop that acks one by one).
        self._acks: dict[tuple[str, str, bool], list[Any]] = {}
        self._acks_waiting = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._scripts = {
            name: redis.register_script(source)
            for name, source in (("promote", PROMOTE), ("retry", RETRY), ("bury", BURY))
        }

    async def ensure(self, lane: Lane) -> None:
        """The lane's consumer group on its streams, where missing (a new group starts at the
        oldest entry kept)."""
        for stream in dict.fromkeys((lane.stream, lane.own)):
            try:
                await self.redis.xgroup_create(stream, lane.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):  # it exists already: fine
                    raise

    def free(self, lane: Lane) -> int:
        return lane.spec.concurrency - self._busy.get(lane.dlq, 0)

    async def run(self, lane: Lane, handler: Handler) -> None:
        """Consume the lane until `stop()`; a Redis outage is waited out, never fatal."""
        ack_wait_ms = int(lane.spec.ack_wait_s * 1000)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_acks_forever())
        housekeeping_at = 0.0
        warned = ""
        while not self._stopping:
            try:
                now = time.monotonic()
                if now >= housekeeping_at:
                    housekeeping_at = now + HOUSEKEEPING_S
                    await self._housekeeping(lane, handler, ack_wait_ms)
                free = self.free(lane)
                if free <= 0:
                    await asyncio.sleep(0.005)
                    continue
                answer: Any = await self.redis.xreadgroup(
                    lane.group, self.consumer_name, {lane.stream: ">"}, count=free, block=BLOCK_MS
                )
                self._start_all(lane, handler, lane.stream, answer)
                warned = ""
            except (RedisError, OSError) as exc:
                if str(exc) != warned:
                    logger.warning("%s: Redis unavailable (%s); retrying", lane.spec.name, exc)
                    warned = str(exc)
                with contextlib.suppress(RedisError, OSError):
                    await self.ensure(lane)  # a Redis restarted empty
                await asyncio.sleep(0.25)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop reading, wait up to `timeout_s` for running entries, send the last acks."""
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
            await self._flush_acks()  # the finished entries' acks leave before we return

    # -- the loop's steps ---------------------------------------------------------------------

    async def _housekeeping(self, lane: Lane, handler: Handler, ack_wait_ms: int) -> None:
        """Promote due retries, claim entries whose worker died, read the lane's own stream
        when it has one of its own."""
        now_ms = int(time.time() * 1000)
        await self._scripts["promote"](keys=[lane.own, lane.scheduled], args=[now_ms, 1000])
        for stream in dict.fromkeys((lane.stream, lane.own)):
            await self._reclaim(lane, handler, stream, ack_wait_ms)
        if lane.own != lane.stream and self.free(lane) > 0:
            answer: Any = await self.redis.xreadgroup(
                lane.group, self.consumer_name, {lane.own: ">"}, count=self.free(lane)
            )
            self._start_all(lane, handler, lane.own, answer)

    async def _reclaim(self, lane: Lane, handler: Handler, stream: str, ack_wait_ms: int) -> None:
        """Claim entries idle for the ack wait (their worker died) and run them."""
        free = self.free(lane)
        if free <= 0:
            return
        _, claimed, *_ = await self.redis.xautoclaim(
            stream, lane.group, self.consumer_name, ack_wait_ms, "0-0", count=free
        )
        if not claimed:
            return
        details = await self.redis.xpending_range(
            stream, lane.group, min=claimed[0][0], max=claimed[-1][0], count=len(claimed)
        )
        deliveries = {d["message_id"]: int(d["times_delivered"]) for d in details}
        for entry_id, fields in claimed:
            if fields:  # an entry deleted meanwhile comes back empty
                self._start(lane, handler, stream, entry_id, fields, deliveries.get(entry_id, 2))

    def _start_all(self, lane: Lane, handler: Handler, stream: str, answer: Any) -> None:
        for _, entries in answer or []:
            for entry_id, fields in entries:
                self._start(lane, handler, stream, entry_id, fields, deliveries=1)

    def _start(
        self, lane: Lane, handler: Handler, stream: str, entry_id: Any, raw: dict[Any, Any],
        deliveries: int,
    ) -> None:  # fmt: skip
        fields = {as_text(k): v for k, v in raw.items()}
        if lane.accepts is not None and not lane.accepts(fields):
            self._ack(lane, stream, entry_id)  # not for this lane: acked untouched
            return
        task = asyncio.create_task(
            self._process(lane, handler, stream, entry_id, fields, deliveries)
        )
        self._running[task] = lane.dlq
        self._busy[lane.dlq] = self._busy.get(lane.dlq, 0) + 1
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        lane = self._running.pop(task)
        self._busy[lane] -= 1

    def _ack(self, lane: Lane, stream: str, entry_id: Any) -> None:
        self._acks.setdefault((stream, lane.group, lane.deletes(stream)), []).append(entry_id)
        self._acks_waiting.set()

    async def _process(
        self, lane: Lane, handler: Handler, stream: str, entry_id: Any, fields: Fields,
        deliveries: int,
    ) -> None:  # fmt: skip
        spec = lane.spec
        job_id = as_text(fields["id"])
        attempt = int(fields.get("base", 0)) + deliveries
        payload = json.loads(fields["body"])
        if is_unreported(attempt, spec):
            message = (
                f"attempt {attempt - 1} of {spec.max_attempts} never reported back: its worker "
                "died (crash, os._exit, OOM kill)"
            )
            # Not an attempt: the signal, like the record, names the one that never reported.
            await self.signal("fail", job=spec.name, id=job_id, attempt=attempt - 1, phase="run",
                              error_type="WorkerCrashed", error=message)  # fmt: skip
            await self._bury(lane, stream, entry_id, fields, payload, "WorkerCrashed", message,
                             attempt - 1)  # fmt: skip
            return
        started = time.time()
        latency_ms = max(0, round(started * 1000) - int(fields["run_at"]))
        await self.signal("start", job=spec.name, id=job_id, attempt=attempt, latency_ms=latency_ms)
        renew = asyncio.create_task(self._renew(lane, stream, entry_id, spec.ack_wait_s / 3))
        try:
            await handler(payload, fields, attempt)
        except asyncio.CancelledError:
            raise  # the drain's timeout: left pending, claimed by a live worker later
        except Exception as exc:
            await self._failed(lane, stream, entry_id, fields, payload, attempt, started, exc)
            return
        finally:
            renew.cancel()
        self._ack(lane, stream, entry_id)
        await self.signal("done", job=spec.name, id=job_id, attempt=attempt,
                          duration_ms=round((time.time() - started) * 1000, 3))  # fmt: skip

    async def _failed(
        self, lane: Lane, stream: str, entry_id: Any, fields: Fields, payload: Any,
        attempt: int, started: float, exc: Exception,
    ) -> None:  # fmt: skip
        spec, job_id = lane.spec, as_text(fields["id"])
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        report = {"job": spec.name, "id": job_id, "attempt": attempt,
                  "duration_ms": round((time.time() - started) * 1000, 3)}  # fmt: skip
        decision = decide(Outcome.FAILED, attempt, spec)
        if isinstance(decision, Retry):
            due = int(time.time() * 1000) + decision.delay_ms
            again = {**{k: as_text(v) for k, v in fields.items()}, "run_at": due, "base": attempt}
            member = [str(item) for pair in again.items() for item in pair]
            await self._scripts["retry"](
                keys=[stream, lane.scheduled],
                args=[entry_id, due, json.dumps(member), lane.group, int(lane.deletes(stream))],
            )
            await self.signal("retry", **report, delay_ms=decision.delay_ms, run_at=due,
                              error_type=error_type, error=error)  # fmt: skip
            return
        assert isinstance(decision, DeadLetter)
        await self.signal("fail", **report, phase="run", error_type=error_type, error=error)
        await self._bury(lane, stream, entry_id, fields, payload, error_type, error, attempt)

    async def _bury(
        self, lane: Lane, stream: str, entry_id: Any, fields: Fields, payload: Any,
        error_type: str, error: str, attempts: int,
    ) -> None:  # fmt: skip
        job_id = as_text(fields["id"])
        record = make_record(
            lane.record_subject(fields), job_id, payload, error_type, error, attempts=attempts,
            first_enqueued_at=int(fields["enqueued_at"]), worker=self.instance_id,
        )  # fmt: skip
        await self._scripts["bury"](
            keys=[stream, lane.dlq],
            args=[entry_id, json.dumps(record), DLQ_MAXLEN, lane.group, int(lane.deletes(stream))],
        )
        await self.signal("dlq", job=lane.spec.name, id=job_id, attempts=attempts,
                          error_type=error_type, error=error)  # fmt: skip

    async def _renew(self, lane: Lane, stream: str, entry_id: Any, every_s: float) -> None:
        """Keep a long run's claim fresh, so no peer reclaims it while it runs."""
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(RedisError, OSError):
                await self.redis.xclaim(
                    stream, lane.group, self.consumer_name, 0, [entry_id], justid=True
                )

    async def _flush_acks_forever(self) -> None:
        while not self._stopping:
            await self._acks_waiting.wait()
            self._acks_waiting.clear()
            try:
                await self._flush_acks()
            except (RedisError, OSError) as exc:  # unacked: reclaimed and run again later
                logger.warning("acks not sent (%s); those entries may run again", exc)

    async def _flush_acks(self) -> None:
        batches, self._acks = self._acks, {}
        if not batches:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for (stream, group, delete), entry_ids in batches.items():
                pipe.xack(stream, group, *entry_ids)
                if delete:
                    pipe.xdel(stream, *entry_ids)
            await pipe.execute()


class RedisJobQueue(JobQueue):
    """JobQueue on a redis bus: see the module's docstring."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        native: Any = ctx.bus(bus_alias).native
        self.redis: Redis = native
        self.consumer = RedisConsumer(self.redis, self.instance_id, self.signal)
        self._ensured: set[type[Job]] = set()
        self._enqueue = self.redis.register_script(ENQUEUE)

    @property
    def dlq(self) -> RedisDeadLetters:
        return RedisDeadLetters(self.redis, self._lane)

    async def _lane(self, job_cls: type[Any]) -> Lane:
        return job_lane(await self.ensure(job_cls))

    async def ensure(self, job_cls: type[Job], *, force: bool = False) -> JobSpec:
        spec = self.spec(job_cls)
        if job_cls in self._ensured and not force:
            return spec
        try:
            await self.consumer.ensure(job_lane(spec))
        except (RedisError, OSError) as exc:
            message = f"{spec.name}: cannot set up its stream: {exc}"
            raise DependencyUnavailable("redis", message) from exc
        self._ensured.add(job_cls)
        return spec

    async def stats(self, job_cls: type[Job]) -> JobStats:
        lane = job_lane(await self.ensure(job_cls))
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(lane.stream)
            pipe.xpending(lane.stream, GROUP)
            pipe.zcard(lane.scheduled)
            pipe.xlen(lane.dlq)
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
        lane = job_lane(spec)
        try:
            added = await self._enqueue(
                keys=[lane.stream, lane.scheduled, f"{lane.stream}:dedup:{id}" if id else ""],
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
        stream = job_lane(spec).stream
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id, _, body, headers in envelopes:
                    now = headers[HEADER_ENQUEUED_AT]
                    pipe.xadd(stream, {"id": job_id, "body": body, "enqueued_at": now,
                                       "run_at": now, "base": 0})  # fmt: skip
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable("redis", f"cannot enqueue {spec.name}: {exc}") from exc
        return [job_id for job_id, *_ in envelopes]

    # -- consume ------------------------------------------------------------------------------

    async def consume(self, job_cls: type[Job], handler_ctx: Context | None = None) -> None:
        spec = await self.ensure(job_cls)
        run = self._runner(spec, handler_ctx, job_id_of)
        await self.consumer.run(job_lane(spec), run)

    async def stop(self, timeout_s: float = 30.0) -> None:
        await self.consumer.stop(timeout_s)


class RedisDeadLetters:
    """The DLQ tools over redis lanes (the same calls as DeadLetters on NATS). `locate(cls)`
    gives the lane of a Job or Listener class; a requeued record goes to the lane's own stream
    as a new entry, its attempts starting again at 1."""

    def __init__(self, redis: Redis, locate: Callable[[type[Any]], Awaitable[Lane]]) -> None:
        self.redis = redis
        self.locate = locate

    async def count(self, cls: type[Any]) -> int:
        return int(await self.redis.xlen((await self.locate(cls)).dlq))

    async def list(self, cls: type[Any], limit: int = 50) -> list[DlqRecord]:
        entries: Any = await self.redis.xrevrange((await self.locate(cls)).dlq, count=limit)
        return [_record(entry_id, fields) for entry_id, fields in entries]

    async def requeue(self, cls: type[Any], job_id: str) -> int:
        return await self._requeue(cls, job_id)

    async def requeue_all(self, cls: type[Any]) -> int:
        return await self._requeue(cls, None)

    async def purge(self, cls: type[Any]) -> int:
        key = (await self.locate(cls)).dlq
        count = int(await self.redis.xlen(key))
        await self.redis.delete(key)
        return count

    async def _requeue(self, cls: type[Any], job_id: str | None) -> int:
        lane, requeued = await self.locate(cls), 0
        entries: Any = await self.redis.xrange(lane.dlq)
        for entry_id, raw in entries:
            record = _record(entry_id, raw)
            if job_id is not None and record["id"] != job_id:
                continue
            now = int(time.time() * 1000)
            fields: dict[Any, Any] = {
                "id": record["id"],
                "body": json.dumps(record["payload"], separators=(",", ":")),
                "enqueued_at": record.get("first_enqueued_at") or now,
                "run_at": now,
                "base": 0,  # a new entry with no earlier attempts: that is the attempt reset
                "subject": record["subject"],
            }
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(lane.own, fields)
                pipe.xdel(lane.dlq, entry_id)
                await pipe.execute()
            requeued += 1
        return requeued


def _record(entry_id: Any, fields: dict[Any, Any]) -> DlqRecord:
    raw: Any = fields.get(b"record", fields.get("record"))
    record: DlqRecord = json.loads(raw)
    record["seq"] = int(as_text(entry_id).split("-")[0])
    return record


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def job_id_of(fields: Fields) -> str:
    return as_text(fields["id"])


JobQueue.drivers["redis"] = RedisJobQueue
