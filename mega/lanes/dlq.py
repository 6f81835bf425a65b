"""Dead letters: the record, and the tools to read, requeue and purge them, on every driver.

A job whose tries are exhausted (or that cannot be decoded, or that killed its worker too often)
is kept as one JSON record in its lane's dead letters (on NATS a limits-retention stream, on
Redis a stream, on PostgreSQL a table; kept `dlq_max_age_s`, 7 days by default):

    {"id", "subject", "payload", "error": {"type", "message"}, "attempts",
     "first_enqueued_at", "failed_at", "worker"}            (times in epoch ms)

An undecodable message has `payload: null` and its body in `raw_b64`.

    tools = queue.dlq                                         # the DLQ tools of the queue
    records = await tools.list(EmailJob, limit=20)          # newest first
    older = await tools.list(EmailJob, limit=20, before=records[-1]["seq"])   # the next page
    record = await tools.get(EmailJob, job_id)               # by id, through the engine's index
    await tools.delete(EmailJob, job_id)
    await tools.requeue(EmailJob, records[0]["id"])          # back onto demo.email, attempts reset
    await tools.purge(EmailJob)
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from mega import clock
from mega.drivers.base import Bus, DlqErrorInfo, DlqRecord, DriverUnavailable, Lane
from mega.errors import DependencyUnavailable, JobError
from mega.lanes.records import (
    JobStatus,
    Requeued,
    encode,
    read_status,
    requeued_again,
    requeued_key,
)

__all__ = ["DeadLetters", "DlqRecord", "make_record"]

T = TypeVar("T")


def make_record(
    subject: str,
    job_id: str,
    payload: Any,
    error_type: str,
    error_message: str,
    *,
    attempts: int,
    first_enqueued_at: int | None,
    worker: str,
    raw: bytes | None = None,
    flow_key: str | None = None,
) -> DlqRecord:
    """Build a DLQ record; `raw` (a body that could not be decoded) is kept as base64."""
    record = DlqRecord(
        id=job_id,
        subject=subject,
        payload=payload,
        error=DlqErrorInfo(type=error_type, message=error_message),
        attempts=attempts,
        first_enqueued_at=first_enqueued_at,
        failed_at=clock.now_ms(),
        worker=worker,
    )
    if raw is not None:
        record["raw_b64"] = base64.b64encode(raw).decode("ascii")
    if flow_key is not None:
        record["flow_key"] = flow_key
    return record


class DeadLetters:
    """DLQ tools over one bus (a JobQueue's `dlq`, an EventBus's `dlq`), for a Job or a
    Listener class. `locate(cls)` makes sure the class's lane exists and returns it. Meant for
    operators and status pages."""

    def __init__(self, bus: Bus, locate: Callable[[type[Any]], Awaitable[Lane]]) -> None:
        self.bus = bus
        self.locate = locate

    async def count(self, cls: type[Any]) -> int:
        """Records currently kept."""
        lane = await self.locate(cls)
        return await self._call(lane, self.bus.count_dead(lane))

    async def list(
        self, cls: type[Any], limit: int = 50, before: int | None = None
    ) -> list[DlqRecord]:
        """Up to `limit` records, newest first, each with its `seq`; `before`: only those whose
        seq is below it, so the next page is `list(cls, limit, before=page[-1]["seq"])`. Each
        page is a range read of the engine: as fast with 100,000 records as with 10."""
        lane = await self.locate(cls)
        return await self._call(lane, self.bus.dead_letters(lane, limit=limit, before=before))

    async def get(self, cls: type[Any], job_id: str) -> DlqRecord | None:
        """The newest record of this job id (with its `seq`), None when there is none."""
        lane = await self.locate(cls)
        return await self._call(lane, self.bus.dead_letter(lane, job_id))

    async def delete(self, cls: type[Any], job_id: str) -> bool:
        """Delete the newest record of this job id; False when there was none."""
        lane = await self.locate(cls)
        record = await self._call(lane, self.bus.dead_letter(lane, job_id))
        if record is None or "seq" not in record:
            return False
        return await self._call(lane, self.bus.delete_dead(lane, record["seq"]))

    async def requeue(self, cls: type[Any], job_id: str) -> int:
        """Store the record(s) with this job id on the lane again, attempts reset, and delete
        them from the DLQ, each found by its id (`Bus.dead_letter`, no scan). Returns how many
        were requeued (0: no such id)."""
        lane = await self.locate(cls)
        chosen: list[DlqRecord] = []
        while (record := await self._call(lane, self.bus.dead_letter(lane, job_id))) is not None:
            if chosen and record.get("seq", 0) >= chosen[-1].get("seq", 0):
                break  # a newer one (the requeued job failed again) or one not deleted
            _requeueable(lane, record)
            await self._queued_again(lane, [record])
            await self._call(lane, self.bus.requeue(lane, record))
            chosen.append(record)
        return len(chosen)

    async def requeue_all(self, cls: type[Any]) -> int:
        """Requeue every record; returns the count."""
        lane = await self.locate(cls)
        records = await self._call(lane, self.bus.dead_letters(lane, limit=2**31))
        chosen = list(reversed(records))
        for record in chosen:
            _requeueable(lane, record)
        await self._queued_again(lane, chosen)
        for record in chosen:
            await self._call(lane, self.bus.requeue(lane, record))
        return len(chosen)

    async def purge(self, cls: type[Any]) -> int:
        """Delete every record; returns how many there were."""
        lane = await self.locate(cls)
        return await self._call(lane, self.bus.purge(lane))

    async def _queued_again(self, lane: Lane, records: Sequence[DlqRecord]) -> None:
        """A requeued job's status record says `queued` again (its old run's `dlq` would
        answer `cancel` and `result` for the new run). Written before the job is stored again:
        a worker may run it and write `done` at once, which a `queued` written after would
        hide for good."""
        if not records or lane.kind != "job" or lane.keep_status_s <= 0:
            return
        now_ms = clock.now_ms()
        fresh: list[tuple[str, bytes]] = []
        for job_id in dict.fromkeys(r["id"] for r in records):
            # Its runs so far are kept apart: the new ones count from attempt 1 again.
            status = await self._call(lane, read_status(self.bus, lane, job_id))
            earlier = None
            if status is not None and status.requeues:
                earlier = Requeued(times=status.requeues, runs=status.before_requeue)
            kept = requeued_again(status, earlier).model_dump_json(exclude_defaults=True)
            queued = JobStatus(id=job_id, job=lane.name, state="queued", enqueued_at=now_ms)
            fresh += [(requeued_key(job_id), kept.encode()), (job_id, encode(queued))]
        await self._call(lane, self.bus.put_records(lane, "status", fresh, create=False))

    async def _call(self, lane: Lane, call: Awaitable[T]) -> T:
        try:
            return await call
        except DriverUnavailable as exc:
            raise DependencyUnavailable(
                self.bus.driver, f"{lane.name}: cannot reach its dead letters: {exc}"
            ) from exc


def _requeueable(lane: Lane, record: DlqRecord) -> None:
    """JobError for a record whose body could not be decoded: storing those bytes again would
    only dead-letter them again."""
    if "raw_b64" in record:
        raise JobError(
            f"{lane.name}: DLQ record {record['id']} holds an undecodable body; "
            "fix or purge it instead of requeueing",
            code="job.not_requeueable",
        )
