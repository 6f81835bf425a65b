"""What became of a job: its status record, written by the queue and the consume loop, read by
anyone with its id.

    status = await queue.status(SendReceipt, job_id)     # or SendReceipt.status(ctx, job_id)
    status.state                                          # "queued", "running", "done", ...
    value = await queue.result(SendReceipt, job_id, timeout_s=30)

Each job's record lives in its lane's "status" store on the bus (`Bus.put_records`: a JetStream
key-value bucket, Redis keys, a PostgreSQL table, memory), kept `keep_status_s` after its last
change; what `run` returned, in the "result" store for `keep_result_s` (0 by default: not kept).

The writers never read first. The enqueue creates the record (`queued` or `delayed`) only where
none exists, so it never overwrites a run that raced ahead of it; each later record is whole,
made from what the writer knows (the delivery, the attempt, the outcome), and overwrites. A
consume loop's writes go out in batches, in order, and the ones a later write of the same job
supersedes before they leave are never sent: a no-op job that starts and ends within one batch
costs one write. A job's last record (`done`, `dlq`, `cancelled`) is stored before its delivery
is settled, and a retry's `retrying` before the job is handed back (`sent`, which sends the
batch at once): a worker killed between the two leaves a job that runs again, never a settled
job whose record still says `running`, and the next attempt's records, perhaps another
worker's, always come after the last one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from mega import clock
from mega.drivers.base import Bus, Delivery, DriverUnavailable, Lane, Message

logger = logging.getLogger("mega.jobqueue")

State = Literal["queued", "delayed", "running", "retrying", "done", "failed", "dlq", "cancelled"]
# The states a job does not leave (a requeue from the DLQ makes it a new run: `queued` again).
FINAL: frozenset[str] = frozenset({"done", "dlq", "cancelled"})
# How often `result` looks at the record while it waits.
RESULT_POLL_S = 0.05
# A worker's records wait this long before they are sent, so that the reports of a short job
# (running, then done) are one write; a settle waiting on them (StatusWriter.sent) sends them
# at once.
FLUSH_DELAY_S = 0.02
# The longest a settle waits for its job's records to be stored (StatusWriter.sent).
SENT_TIMEOUT_S = 5.0
# A `failed` record this old whose dead letter is stored is shown `dlq`: its worker stored the
# dead letter and died before its `dlq` went out (sooner, the `dlq` may still be on its way, and
# a requeue in between would be overwritten by it).
FAILED_GRACE_S = 5.0
# Compact JSON, as pydantic writes it.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# The most earlier attempts `read_status` reads into a record's history (the latest ones).
MAX_HISTORY = 20


class ErrorInfo(BaseModel):
    type: str
    message: str


class AttemptRecord(BaseModel):
    """One earlier attempt of a job, as its status record said when the next one started:
    `retrying` or `failed` (with its `error`), or `lost` (its worker died while it ran)."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    state: str
    worker: str | None = None
    started_at: int | None = None
    finished_at: int | None = None
    error: ErrorInfo | None = None


class Cause(BaseModel):
    """What was running when a job was enqueued: a listener's run of an event (`kind`
    "event", `name` the event's, `id` its id, `group` the listener group) or another job's
    run (`kind` "job")."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["event", "job"]
    name: str
    id: str
    group: str | None = None


class Running(NamedTuple):
    """The run a task is part of, as the consume loop sets it for each attempt (a tuple: it
    is made for every job, and becomes a Cause only when the run enqueues one)."""

    kind: Literal["event", "job"]
    name: str
    id: str
    group: str | None


RUNNING: ContextVar[Running | None] = ContextVar("mega_running", default=None)
# A delivery's settle (the receiver's ack), called by the writer once its records are stored.
Settle = Callable[[Delivery], Awaitable[None]]


class JobStatus(BaseModel):
    """A job's status record.

    `state`: `queued` (stored, waiting for a worker), `delayed` (held until `due_at`),
    `running`, `retrying` (an attempt failed; the next is due at `due_at`), `done`, `failed`
    (the last attempt failed and its dead letter is not stored yet), `dlq` (dead-lettered),
    `cancelled`. `attempts`: runs started so far. Times are epoch ms: `enqueued_at`, `due_at`,
    `started_at` (the latest attempt's), `finished_at`. `worker`: the instance id of the
    latest attempt's worker. `error`: the latest failure. `result_kept`: `result()` can answer
    with what `run` returned. `history`: the attempts before the latest, oldest first (read
    with the record by `JobQueue.status`; each is stored under a key of its own). `cause`: the
    run that enqueued it (an event's listener, another job), when one did. `requeues`: how
    often the DLQ gave it back (its attempts then count from 1 again), and `before_requeue`
    the attempts it made before, oldest first, each time's last one included (`dlq`)."""

    model_config = ConfigDict(frozen=True)

    id: str
    job: str
    state: State
    attempts: int = 0
    enqueued_at: int | None = None
    due_at: int | None = None
    started_at: int | None = None
    finished_at: int | None = None
    worker: str | None = None
    error: ErrorInfo | None = None
    result_kept: bool = False
    history: tuple[AttemptRecord, ...] = ()
    cause: Cause | None = None
    requeues: int = 0
    before_requeue: tuple[AttemptRecord, ...] = ()

    @property
    def final(self) -> bool:
        return self.state in FINAL


def attempt_key(job_id: str, attempt: int) -> str:
    """The key of a job's earlier attempt (a space, which no job id has, keeps it apart)."""
    return f"{job_id} attempt {attempt}"


def requeued_key(job_id: str) -> str:
    """The key of what a job did before the DLQ gave it back (`Requeued`)."""
    return f"{job_id} requeued"


class Requeued(BaseModel):
    """A requeued job's earlier runs (`JobStatus.before_requeue`) and how often it was."""

    times: int
    runs: tuple[AttemptRecord, ...]


def requeued_again(status: JobStatus | None, earlier: Requeued | None) -> Requeued:
    """What a job's requeue keeps: the runs kept before (at most MAX_HISTORY * 2, the newest)
    and this life's, its last attempt included."""
    runs = list(earlier.runs if earlier is not None else ())
    if status is not None:
        runs += status.history
        if status.attempts:
            runs.append(as_attempt(status))
    times = (earlier.times if earlier is not None else 0) + 1
    return Requeued(times=times, runs=tuple(runs[-MAX_HISTORY * 2 :]))


def cause_key(job_id: str) -> str:
    """The key of what caused a job (written once, with its first record)."""
    return f"{job_id} cause"


def created(job: str, messages: list[Message]) -> list[tuple[str, bytes]]:
    """The first records of new jobs: each one's status, and what caused them when they were
    enqueued from a run (under `cause_key`: the workers' records replace the status)."""
    records = [(message.id, encode(enqueued(job, message))) for message in messages]
    running = RUNNING.get()
    if running is not None:
        raw = Cause(**running._asdict()).model_dump_json(exclude_defaults=True).encode()
        records += [(cause_key(message.id), raw) for message in messages]
    return records


def as_attempt(status: JobStatus) -> AttemptRecord:
    """What a job's record says of its latest attempt, kept once the next one starts: a
    record still `running` means the attempt's worker died."""
    state = "lost" if status.state == "running" else status.state
    return AttemptRecord(
        attempt=status.attempts,
        state=state,
        worker=status.worker,
        started_at=status.started_at,
        finished_at=status.finished_at,
        error=status.error,
    )


def encode(status: JobStatus) -> bytes:
    return status.model_dump_json(exclude_defaults=True).encode()


def decode(raw: bytes) -> JobStatus:
    return JobStatus.model_validate_json(raw)


def enqueued(job: str, message: Message) -> JobStatus:
    """The record a new job starts with: `queued`, or `delayed` until its time."""
    delayed = message.run_at_ms is not None
    return JobStatus(
        id=message.id,
        job=job,
        state="delayed" if delayed else "queued",
        enqueued_at=message.enqueued_at_ms,
        due_at=message.run_at_ms,
    )


class Report(NamedTuple):
    """What the consume loop said of a job, waiting to be sent as its record."""

    attempts: int
    state: State
    enqueued_at: int | None
    fields: dict[str, Any]


class StatusWriter:
    """The records of one job lane in one process: each report is queued, and a flush
    `FLUSH_DELAY_S` later sends what is queued in one `put_records` call. A later report of a
    job replaces its earlier one while both wait, so a job that starts and ends within the
    delay costs one write. Best effort: a bus that does not answer loses the batch (logged),
    never a job.

    An attempt after the first keeps the one before it under `attempt_key` (its history):
    from the record it replaces here, or read from the store at the flush."""

    def __init__(self, bus: Bus, lane: Lane, *, worker: str) -> None:
        self.bus = bus
        self.lane = lane
        self.worker = worker
        self.on = lane.keep_status_s > 0
        self.keep_results = lane.keep_result_s > 0
        self._statuses: dict[str, Report] = {}
        self._results: dict[str, bytes] = {}
        self._earlier: dict[str, int] = {}  # job id -> an earlier attempt to read and keep
        # job id -> its last run, which another process made (or this one before it died): its
        # record names that run's worker and start, read from the store at the flush.
        self._unrun: dict[str, int] = {}
        self._attempts: list[tuple[str, bytes]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._batch_sent: asyncio.Future[None] | None = None  # of the reports queued now
        self._hurry = asyncio.Event()  # set by `sent`, `then`: the flush goes now
        self._settles: list[tuple[Settle, Delivery]] = []  # called once the batch is stored

    # -- what the consume loop reports ---------------------------------------------------------

    def started(self, delivery: Delivery, started_ms: int) -> None:
        self._write(delivery, "running", started_at=started_ms)

    def retrying(self, delivery: Delivery, started_ms: int, error: ErrorInfo, due_ms: int) -> None:
        self._write(delivery, "retrying", started_at=started_ms, error=error, due_at=due_ms)

    def ended(
        self,
        delivery: Delivery,
        started_ms: int | None,
        state: State,
        error: ErrorInfo | None,
        *,
        attempts: int | None = None,
    ) -> None:
        """A last state: `failed` (its dead letter not stored yet), `dlq` or `cancelled`.
        `attempts`: the runs, where the delivery's count is one more (a run that never
        reported back)."""
        self._write(
            delivery, state, attempts, started_at=started_ms, error=error, finished_at=_now_ms()
        )

    def done(self, delivery: Delivery, started_ms: int, result: Any) -> None:
        kept = False
        if self.keep_results and result is not None:
            try:
                body = json.dumps(result, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                logger.warning(
                    "%s: job %s returned a value that is not JSON (%s): its result is not kept",
                    self.lane.name,
                    delivery.id,
                    exc,
                )
            else:
                self._results[delivery.id] = body
                kept = True
        self._write(
            delivery, "done", started_at=started_ms, finished_at=_now_ms(), result_kept=kept
        )

    def then(self, settle: Settle, delivery: Delivery) -> None:
        """Call `settle(delivery)` (an ack) once the reports queued so far are stored, or
        their write failed (logged): the flush goes now, and the settles follow its write in
        the order they came."""
        self._settles.append((settle, delivery))
        self._hurry.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    def _write(
        self, delivery: Delivery, state: State, attempts: int | None = None, **fields: Any
    ) -> None:
        if not self.on:
            return
        job_id, attempt = delivery.id, delivery.attempt if attempts is None else attempts
        if 1 <= attempt < delivery.attempt:  # an end written for a run that was not this one
            self._unrun[job_id] = attempt
        # Kept as its fields, made a record only if no later report replaces it first.
        report = Report(attempt, state, delivery.enqueued_at_ms, fields)
        replaced = self._statuses.pop(job_id, None)  # re-inserted last: batches keep order
        self._statuses[job_id] = report
        if replaced is not None and replaced.attempts < attempt:
            self._keep(job_id, as_attempt(self._record(job_id, replaced)))
        elif replaced is None and attempt > 1 and (state == "running" or not fields["started_at"]):
            self._earlier[job_id] = attempt - 1  # its first report (a start, or an end unrun)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    def _record(self, job_id: str, report: Report) -> JobStatus:
        fields = {"worker": self.worker, **report.fields}
        return JobStatus(
            id=job_id,
            job=self.lane.name,
            state=report.state,
            attempts=report.attempts,
            enqueued_at=report.enqueued_at,
            **fields,
        )

    def _record_json(self, job_id: str, report: Report) -> bytes:
        """`encode(self._record(...))`'s fields without the model: they are the loop's own,
        typed, and this runs for every job a worker ends (the model took a third of the time
        a no-op job's record costs)."""
        record: dict[str, Any] = {
            "id": job_id,
            "job": self.lane.name,
            "state": report.state,
            "attempts": report.attempts,
            "worker": self.worker,
        }
        if report.enqueued_at is not None:
            record["enqueued_at"] = report.enqueued_at
        for name, value in report.fields.items():
            if value is None or value is False:
                continue  # a default: left out, as encode leaves it
            record[name] = value.model_dump() if isinstance(value, ErrorInfo) else value
        return _JSON.encode(record).encode()

    def _keep(self, job_id: str, attempt: AttemptRecord) -> None:
        record = attempt.model_dump_json(exclude_defaults=True).encode()
        self._attempts.append((attempt_key(job_id, attempt.attempt), record))

    async def ended_before(self, delivery: Delivery) -> str | None:
        """`done` or `cancelled` when the job's stored record says a run before this delivery
        ended it, else None (also when the store does not answer: the delivery then goes on
        as it would have)."""
        try:
            [raw] = await self.bus.get_records(self.lane, "status", [delivery.id])
        except DriverUnavailable:
            return None
        status = None if raw is None else decode(raw)
        if status is None or status.state not in ("done", "cancelled"):
            return None
        return status.state if 1 <= status.attempts < delivery.attempt else None

    # -- sending -------------------------------------------------------------------------------

    async def sent(self, timeout_s: float = SENT_TIMEOUT_S) -> None:
        """Send the reports queued so far now, and wait until they are stored (or their write
        failed, which is logged), up to `timeout_s`. The consume loop calls it before a dead
        letter and before it hands a job back: a retry's `retrying` stored after the next
        attempt's end (another worker's, perhaps) would replace it. (An ack waits on its
        record through `then`, without holding its run's task.)"""
        if self._flusher is None or self._flusher.done():
            return
        if self._batch_sent is None:
            self._batch_sent = asyncio.get_running_loop().create_future()
        self._hurry.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._batch_sent)

    async def _flush(self) -> None:
        if not self._hurry.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_DELAY_S):
                    await self._hurry.wait()
        while self._statuses or self._results or self._settles:
            self._hurry.clear()
            results, self._results = self._results, {}
            statuses, self._statuses = self._statuses, {}
            settles, self._settles = self._settles, []
            batch_sent, self._batch_sent = self._batch_sent, None
            try:
                if self._earlier or self._unrun:
                    await self._read_earlier(statuses)
                attempts, self._attempts = self._attempts, []
                if results:  # before the `done` that says it is there
                    await self.bus.put_records(
                        self.lane, "result", list(results.items()), create=False
                    )
                records = attempts + [
                    (job_id, self._record_json(job_id, report))
                    for job_id, report in statuses.items()
                ]
                await self.bus.put_records(
                    self.lane, "status", records, create=False, confirm=False
                )
            except DriverUnavailable as exc:
                logger.warning(
                    "%s: %d job status record(s) not written, the bus did not answer: %s",
                    self.lane.name,
                    len(statuses),
                    exc,
                )
            finally:
                for settle, delivery in settles:
                    await _quietly(settle, delivery, self.lane.name)
                if batch_sent is not None:
                    batch_sent.set_result(None)
        # Nothing left to send: what a wait began on while the last batch was written is stored.
        if self._batch_sent is not None:
            self._batch_sent.set_result(None)
            self._batch_sent = None
        self._hurry.clear()

    async def _read_earlier(self, statuses: dict[str, Report]) -> None:
        """Keep the attempts before each retried job's latest: the one the store's record
        says, and as `lost` (no worker known) any after it that left no record (a worker that
        died before its first write). An end written for a run this process did not make (a
        dead letter for a run that never reported back, a cancel before the next run) names
        that run's worker and start, as the store's record of it says (none when it left no
        record), not this process, which only wrote it down."""
        earlier, self._earlier = self._earlier, {}
        unrun, self._unrun = self._unrun, {}
        ids = list(earlier.keys() | unrun.keys())
        for job_id, raw in zip(
            ids, await self.bus.get_records(self.lane, "status", ids), strict=True
        ):
            status = None if raw is None else decode(raw)
            stored = 0 if status is None else status.attempts
            last = earlier.get(job_id)
            if last is not None:
                if status is not None and 1 <= stored <= last:
                    self._keep(job_id, as_attempt(status))
                for attempt in range(stored + 1, last + 1):
                    self._keep(job_id, AttemptRecord(attempt=attempt, state="lost"))
            report = statuses.get(job_id)
            if job_id in unrun and report is not None and report.attempts == unrun[job_id]:
                ran = status if status is not None and stored == report.attempts else None
                fields = {**report.fields, "worker": ran.worker or "" if ran else ""}
                if ran is not None and not fields.get("started_at"):
                    fields["started_at"] = ran.started_at
                statuses[job_id] = report._replace(fields=fields)

    async def close(self) -> None:
        """Send what is queued (the consume loop calls it when it stops)."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)


async def read_status(bus: Bus, lane: Lane, job_id: str) -> JobStatus | None:
    """A job's status record with its history (its earlier attempts, one read more for a job
    that ran more than once), or None. DriverUnavailable when the bus does not answer."""
    keys = [job_id, cause_key(job_id), requeued_key(job_id)]
    raw, cause, requeued = await bus.get_records(lane, "status", keys)
    if raw is None:
        return None
    status = decode(raw)
    if requeued is not None:
        earlier = Requeued.model_validate_json(requeued)
        status = status.model_copy(
            update={"requeues": earlier.times, "before_requeue": earlier.runs}
        )
    if status.state == "failed":
        status = await _dead_lettered(bus, lane, status)
    if cause is not None:
        status = status.model_copy(update={"cause": Cause.model_validate_json(cause)})
    if status.attempts <= 1:
        return status
    first = max(1, status.attempts - MAX_HISTORY)
    keys = [attempt_key(job_id, n) for n in range(first, status.attempts)]
    history = tuple(
        AttemptRecord.model_validate_json(raw)
        for raw in await bus.get_records(lane, "status", keys)
        if raw is not None
    )
    return status.model_copy(update={"history": history})


async def _quietly(settle: Settle, delivery: Delivery, lane: str) -> None:
    """A settle the writer calls: drivers take their settles without raising (one lost
    only runs its job again), so one that raises is logged and the batch's others go on."""
    try:
        await settle(delivery)
    except Exception:
        logger.exception("%s: job %s: its ack failed; it will run again", lane, delivery.id)


async def _dead_lettered(bus: Bus, lane: Lane, status: JobStatus) -> JobStatus:
    """A `failed` record is stored before the dead letter; `dlq` comes after it. A worker
    killed between the two left `failed` for good: older than FAILED_GRACE_S and found in the
    dead letters (this run's: its attempts, failed since it started), the job is shown `dlq`,
    as it is."""
    if status.finished_at is None or _now_ms() - status.finished_at < FAILED_GRACE_S * 1000:
        return status
    record = await bus.dead_letter(lane, status.id)
    if (
        record is None
        or record["attempts"] != status.attempts
        or record["failed_at"] < (status.started_at or 0)
    ):
        return status
    return status.model_copy(update={"state": "dlq"})


def _now_ms() -> int:
    return clock.now_ms()
