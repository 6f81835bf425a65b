"""A job's records: its status (`JobStatus`, with its attempts' history and what caused it),
how they are keyed, encoded and read. The queue creates a job's first record (`created`), the
consume loop writes the others (mega/lanes/status.py), anyone with its id reads them.

    status = await queue.status(SendReceipt, job_id)     # or SendReceipt.status(ctx, job_id)
    status.state                                          # "queued", "running", "done", ...
    value = await queue.result(SendReceipt, job_id, timeout_s=30)

Each job's record lives in its lane's "status" store on the bus (`Bus.put_records`: a JetStream
key-value bucket, Redis keys, a PostgreSQL table, memory), kept `keep_status_s` after its last
change; what `run` returned, in the "result" store for `keep_result_s` (0 by default: not kept).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from mega import clock
from mega.drivers.base import Bus, Lane, Message

State = Literal["queued", "delayed", "running", "retrying", "done", "failed", "dlq", "cancelled"]
# The states a job does not leave (a requeue from the DLQ makes it a new run: `queued` again).
FINAL: frozenset[str] = frozenset({"done", "dlq", "cancelled"})
# How often `result` looks at the record while it waits.
RESULT_POLL_S = 0.05
# A `failed` record this old whose dead letter is stored is shown `dlq`: its worker stored the
# dead letter and died before its `dlq` went out (sooner, the `dlq` may still be on its way, and
# a requeue in between would be overwritten by it).
FAILED_GRACE_S = 5.0
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
