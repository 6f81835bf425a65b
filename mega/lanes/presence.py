"""Workers seen: each consume loop says, every few seconds, that it runs and how busy it is.

A loop writes one small record for its process into its lane's "workers" table
(`RecordStore.put_records`, kept `WORKERS_KEEP_S` after its last write): at its start, every
`PRESENCE_EVERY_S` while it runs, and once more at its stop, marked stopped. Anyone with the
lane reads them back (`RecordStore.list_records`): `JobQueue.workers(job_cls)`,
`EventBus.workers(listener_cls)`. The record, as JSON (times in epoch ms):

    {"worker": "worker@host:1234", "started_at", "seen_at", "running": 3, "done": 1207,
     "stopped_at": null}

`running`: deliveries in flight now; `done`: deliveries settled since the loop started (run
to the end, retried, dead-lettered or skipped).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from mega import clock
from mega.drivers.base import WORKERS_KEEP_S, Lane, RecordStore

# How often a running consume loop writes its record.
PRESENCE_EVERY_S = 5.0


class WorkerSeen(BaseModel):
    """One consume loop's record: `worker` (the process's instance id), when it started and
    was last seen (epoch ms), its deliveries running now and settled since its start, and
    when it stopped (None: running)."""

    model_config = ConfigDict(frozen=True)

    worker: str
    started_at: int
    seen_at: int
    running: int
    done: int
    stopped_at: int | None = None


class Presence:
    """The record of one consume loop (`worker`) on its lane."""

    def __init__(self, bus: RecordStore, lane: Lane, worker: str) -> None:
        self.bus = bus
        self.lane = lane
        self.worker = worker
        self.started_at = _now_ms()

    async def write(self, *, running: int, done: int, stopped: bool = False) -> None:
        """Write the record now (raises DriverUnavailable)."""
        now = _now_ms()
        seen = WorkerSeen(
            worker=self.worker,
            started_at=self.started_at,
            seen_at=now,
            running=running,
            done=done,
            stopped_at=now if stopped else None,
        )
        value = seen.model_dump_json().encode()
        await self.bus.put_records(self.lane, "workers", [(self.worker, value)], create=False)


async def read_workers(bus: RecordStore, lane: Lane) -> list[WorkerSeen]:
    """The lane's workers, the last seen first; a record not written for `WORKERS_KEEP_S`
    (or one that is not a worker record) left out. Raises DriverUnavailable."""
    return fresh(await bus.list_records(lane, "workers"))


def fresh(records: Sequence[tuple[str, bytes]]) -> list[WorkerSeen]:
    oldest_ms = _now_ms() - WORKERS_KEEP_S * 1000
    seen: list[WorkerSeen] = []
    for _key, value in records:
        try:
            worker = WorkerSeen.model_validate(json.loads(value))
        except (ValueError, ValidationError):
            continue
        if worker.seen_at >= oldest_ms:
            seen.append(worker)
    return sorted(seen, key=lambda worker: worker.seen_at, reverse=True)


def _now_ms() -> int:
    return clock.now_ms()
