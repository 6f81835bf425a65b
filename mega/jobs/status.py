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
costs one write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from mega.drivers.base import Bus, Delivery, DriverUnavailable, Lane, Message

logger = logging.getLogger("mega.jobqueue")

State = Literal["queued", "delayed", "running", "retrying", "done", "failed", "dlq", "cancelled"]
# The states a job does not leave (a requeue from the DLQ makes it a new run: `queued` again).
FINAL: frozenset[str] = frozenset({"done", "dlq", "cancelled"})
# How often `result` looks at the record while it waits.
RESULT_POLL_S = 0.05


class ErrorInfo(BaseModel):
    type: str
    message: str


class JobStatus(BaseModel):
    """A job's status record.

    `state`: `queued` (stored, waiting for a worker), `delayed` (held until `due_at`),
    `running`, `retrying` (an attempt failed; the next is due at `due_at`), `done`, `failed`
    (the last attempt failed and its dead letter is not stored yet), `dlq` (dead-lettered),
    `cancelled`. `attempts`: runs started so far. Times are epoch ms: `enqueued_at`, `due_at`,
    `started_at` (the latest attempt's), `finished_at`. `worker`: the instance id of the
    latest attempt's worker. `error`: the latest failure. `result_kept`: `result()` can answer
    with what `run` returned."""

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

    @property
    def final(self) -> bool:
        return self.state in FINAL


def encode(status: JobStatus) -> bytes:
    return status.model_dump_json(exclude_defaults=True).encode()


def decode(raw: bytes) -> JobStatus:
    return JobStatus.model_validate_json(raw)


def enqueued(job: str, message: Message) -> JobStatus:
    """The record a new job starts with: `queued`, or `delayed` until its time."""
    delayed = message.run_at_ms is not None
    return JobStatus(
        id=message.id, job=job, state="delayed" if delayed else "queued",
        enqueued_at=message.enqueued_at_ms, due_at=message.run_at_ms,
    )  # fmt: skip


class StatusWriter:
    """The records of one job lane in one process: `write(record)` queues it, a background
    flush sends what is queued in one `put_records` call, and a later record of a job replaces
    its earlier one while both wait. Best effort: a bus that does not answer loses the batch
    (logged), never a job."""

    def __init__(self, bus: Bus, lane: Lane, *, worker: str) -> None:
        self.bus = bus
        self.lane = lane
        self.worker = worker
        self.on = lane.keep_status_s > 0
        self.keep_results = lane.keep_result_s > 0
        self._statuses: dict[str, bytes] = {}
        self._results: dict[str, bytes] = {}
        self._flusher: asyncio.Task[None] | None = None

    # -- what the consume loop reports ---------------------------------------------------------

    def started(self, delivery: Delivery, started_ms: int) -> None:
        self._write(delivery, "running", started_at=started_ms)

    def retrying(self, delivery: Delivery, started_ms: int, error: ErrorInfo, due_ms: int) -> None:
        self._write(delivery, "retrying", started_at=started_ms, error=error, due_at=due_ms)

    def ended(
        self, delivery: Delivery, started_ms: int | None, state: State, error: ErrorInfo | None
    ) -> None:
        """A last state: `failed` (its dead letter not stored yet), `dlq` or `cancelled`."""
        self._write(
            delivery, state, started_at=started_ms, error=error, finished_at=_now_ms()
        )  # fmt: skip

    def done(self, delivery: Delivery, started_ms: int, result: Any) -> None:
        kept = False
        if self.keep_results and result is not None:
            try:
                body = json.dumps(result, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                logger.warning(
                    "%s: job %s returned a value that is not JSON (%s): its result is not kept",
                    self.lane.name, delivery.id, exc,
                )  # fmt: skip
            else:
                self._results[delivery.id] = body
                kept = True
        self._write(
            delivery, "done", started_at=started_ms, finished_at=_now_ms(), result_kept=kept
        )

    def _write(self, delivery: Delivery, state: State, **fields: Any) -> None:
        if not self.on:
            return
        record = JobStatus(
            id=delivery.id, job=self.lane.name, state=state, attempts=delivery.attempt,
            enqueued_at=delivery.enqueued_at_ms, worker=self.worker, **fields,
        )  # fmt: skip
        self._statuses.pop(delivery.id, None)  # re-inserted last: the batch keeps write order
        self._statuses[delivery.id] = encode(record)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    # -- sending -------------------------------------------------------------------------------

    async def _flush(self) -> None:
        while self._statuses or self._results:
            results, self._results = self._results, {}
            statuses, self._statuses = self._statuses, {}
            try:
                if results:  # before the `done` that says it is there
                    await self.bus.put_records(
                        self.lane, "result", list(results.items()), create=False
                    )
                if statuses:
                    await self.bus.put_records(
                        self.lane, "status", list(statuses.items()), create=False, confirm=False
                    )
            except DriverUnavailable as exc:
                logger.warning(
                    "%s: %d job status record(s) not written, the bus did not answer: %s",
                    self.lane.name, len(statuses), exc,
                )  # fmt: skip

    async def close(self) -> None:
        """Send what is queued (the consume loop calls it when it stops)."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)


def _now_ms() -> int:
    return int(time.time() * 1000)
