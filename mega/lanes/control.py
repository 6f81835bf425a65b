"""Control of a job's queue while the fleet runs: cancel one job, pause and resume the queue.

Both are records in the lane's "status" store (`RecordStore.put_records`), so they work the same on
every driver and every host sees them without a channel of its own:

- **Cancel** writes a mark under the job's `cancel_key` (a tombstone), then its status record
  as `cancelled`. A worker reads the marks of what it fetched before it starts them, and skips
  (acks) a cancelled one; each second it reads the marks of what it runs, and cancels the task
  of a cancelled one. The mark has a key of its own so that a worker's own status writes (its
  `running`, sent a moment after the start) never overwrite it. Both reads happen only while
  the lane's cancel window is open: a cancel opens it for `keep_status_s` (the mark's life) in
  the record `CANCELS_KEY`, so a queue nobody cancels in pays one small read per fetch (that
  record), and nothing per job.
- **Pause** sets `PAUSE_KEY`. Each worker reads it every second (`WATCH_S`): a paused queue
  starts nothing new and its running jobs finish; resume clears it. The record lives in the
  status store, whose records expire `keep_status_s` after their last write, so a worker
  writes it again (`kept_at`) once half of that has passed: a pause holds while any worker
  runs, however long. With no worker at all for `keep_status_s`, it lapses.

These keys hold a space, which no job id may, so they never meet a job's record.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from mega import clock
from mega.drivers.base import Lane, RecordStore
from mega.lanes.records import JobStatus, decode, encode

# The lane's control records (keys no job id can be: ids have no spaces).
CANCELS_KEY = "lane cancels"
PAUSE_KEY = "lane pause"
# How often a worker reads the control records while it runs.
WATCH_S = 1.0


logger = logging.getLogger("mega.jobqueue")


@dataclass
class Unanswered:
    """A read the consume loop makes again and again (its pause, its cancels) while it fails:
    said once when it starts failing and once when it answers again, with how many failed in
    between. An outage is hundreds of reads, and a line each would bury it."""

    name: str  # the job's, which begins each line
    failing: str  # %s: the error
    back: str  # %d: the reads that failed
    count: int = 0

    def failed(self, error: BaseException) -> None:
        if not self.count:
            logger.warning("%s: " + self.failing, self.name, str(error) or "no answer in time")
        self.count += 1

    def answered(self) -> None:
        if self.count:
            logger.info("%s: " + self.back, self.name, self.count)
            self.count = 0


@dataclass(frozen=True)
class Cancelled:
    """What `cancel` answers: whether this call cancelled the job, and its state now."""

    cancelled: bool
    state: str


@dataclass(frozen=True)
class Pause:
    """A queue's pause record: since when (epoch ms) and who paused it."""

    paused: bool
    at_ms: int | None = None
    by: str | None = None


async def cancel(bus: RecordStore, lane: Lane, job: str, job_id: str) -> Cancelled:
    """Cancel one job: a finished one is left as it is (False and its state); any other
    (queued, delayed, retrying, running, or unknown here yet) gets the `cancelled` record."""
    [raw] = await bus.get_records(lane, "status", [job_id])
    status = None if raw is None else decode(raw)
    if status is not None and status.final:
        return Cancelled(False, status.state)
    now_ms = clock.now_ms()
    # The window first: a worker that sees the tombstone must also have seen the window.
    window = json.dumps({"until": now_ms + int(lane.keep_status_s * 1000)}).encode()
    await bus.put_records(lane, "status", [(CANCELS_KEY, window)], create=False)
    base = status or JobStatus(id=job_id, job=job, state="cancelled")
    record = base.model_copy(update={"state": "cancelled", "finished_at": now_ms})
    mark = json.dumps({"at_ms": now_ms}).encode()
    await bus.put_records(
        lane, "status", [(cancel_key(job_id), mark), (job_id, encode(record))], create=False
    )
    return Cancelled(True, "cancelled")


def cancel_key(job_id: str) -> str:
    """The key of a job's cancel mark."""
    return f"{job_id} cancel"


async def set_pause(bus: RecordStore, lane: Lane, *, paused: bool, by: str) -> Pause:
    record = Pause(paused, clock.now_ms(), by)
    await bus.put_records(lane, "status", [(PAUSE_KEY, _pause_json(record))], create=False)
    return record


async def keep_pause(bus: RecordStore, lane: Lane, fields: dict[str, Any]) -> None:
    """Write a pause record again as it is, with `kept_at` now: its expiry starts over."""
    kept = json.dumps({**fields, "kept_at": clock.now_ms()}).encode()
    await bus.put_records(lane, "status", [(PAUSE_KEY, kept)], create=False)


async def read_pause(bus: RecordStore, lane: Lane) -> Pause:
    [raw] = await bus.get_records(lane, "status", [PAUSE_KEY])
    if raw is None:
        return Pause(False)
    fields: dict[str, Any] = json.loads(raw)
    return Pause(bool(fields.get("paused")), fields.get("at_ms"), fields.get("by"))


def _pause_json(pause: Pause) -> bytes:
    return json.dumps({"paused": pause.paused, "at_ms": pause.at_ms, "by": pause.by}).encode()


class LaneControl:
    """What a consume loop reads of its lane's control records: whether it is paused, whether
    the cancel window is open, and which of some job ids are cancelled."""

    def __init__(self, bus: RecordStore, lane: Lane) -> None:
        self.bus = bus
        self.lane = lane
        self.on = lane.keep_status_s > 0
        self.paused = False
        self.cancels_until_ms = 0

    async def refresh(self) -> None:
        """Read the pause and the cancel window (one call)."""
        if not self.on:
            return
        pause, window = await self.bus.get_records(self.lane, "status", [PAUSE_KEY, CANCELS_KEY])
        fields: dict[str, Any] = {} if pause is None else json.loads(pause)
        self.paused = bool(fields.get("paused"))
        self.cancels_until_ms = 0 if window is None else int(json.loads(window)["until"])
        written_ms = fields.get("kept_at") or fields.get("at_ms") or 0
        if self.paused and clock.now() * 1000 - written_ms > self.lane.keep_status_s * 500:
            await keep_pause(self.bus, self.lane, fields)  # past half its life: kept

    async def refresh_cancels(self) -> None:
        """Read the cancel window alone (what each fetch needs: the pause can wait a second)."""
        if not self.on:
            return
        [window] = await self.bus.get_records(self.lane, "status", [CANCELS_KEY])
        self.cancels_until_ms = 0 if window is None else int(json.loads(window)["until"])

    @property
    def cancelling(self) -> bool:
        return self.cancels_until_ms > clock.now() * 1000

    async def cancelled(self, job_ids: list[str]) -> set[str]:
        """Those of `job_ids` with a cancel mark (none read outside the window)."""
        if not (self.on and self.cancelling and job_ids):
            return set()
        marks = await self.bus.get_records(self.lane, "status", list(map(cancel_key, job_ids)))
        return {job_id for job_id, mark in zip(job_ids, marks, strict=True) if mark is not None}
