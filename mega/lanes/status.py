"""A consume loop's writes of its jobs' records (mega/lanes/records.py): `StatusWriter`.

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
from typing import Any, NamedTuple

from mega import clock
from mega.drivers.base import Bus, Delivery, DriverUnavailable, Lane
from mega.lanes.records import (
    AttemptRecord,
    ErrorInfo,
    JobStatus,
    State,
    as_attempt,
    attempt_key,
    decode,
)

logger = logging.getLogger("mega.jobqueue")

# A worker's records wait this long before they are sent, so that the reports of a short job
# (running, then done) are one write; a settle waiting on them (StatusWriter.sent) sends them
# at once.
FLUSH_DELAY_S = 0.02
# The longest a settle waits for its job's records to be stored (StatusWriter.sent).
SENT_TIMEOUT_S = 5.0
# Compact JSON, as pydantic writes it.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# A delivery's settle (the receiver's ack), called by the writer once its records are stored.
Settle = Callable[[Delivery], Awaitable[None]]


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
            delivery,
            state,
            attempts,
            started_at=started_ms,
            error=error,
            finished_at=clock.now_ms(),
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
            delivery, "done", started_at=started_ms, finished_at=clock.now_ms(), result_kept=kept
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


async def _quietly(settle: Settle, delivery: Delivery, lane: str) -> None:
    """A settle the writer calls: drivers take their settles without raising (one lost
    only runs its job again), so one that raises is logged and the batch's others go on."""
    try:
        await settle(delivery)
    except Exception:
        logger.exception("%s: job %s: its ack failed; it will run again", lane, delivery.id)
