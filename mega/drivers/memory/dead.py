"""The memory bus's dead letters (`DeadLetterStore` of mega.drivers.base): each lane's records
kept in its broker queue in `seq` order, with an index of the newest record per job id."""

from __future__ import annotations

import bisect
import json

from mega import clock
from mega.drivers.base import DlqRecord, Lane
from mega.drivers.memory.broker import MemoryBroker, MemoryMessage


def _seq(record: DlqRecord) -> int:
    return record.get("seq", 0)


class MemoryDeadLetters:
    """The dead-letter tools of a MemoryBus, on its `broker`."""

    broker: MemoryBroker

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """The records are kept in `seq` order: `before` is a bisection."""
        dead = self.broker.lane(lane).dead
        end = len(dead) if before is None else bisect.bisect_left(dead, before, key=_seq)
        return [record.copy() for record in reversed(dead[max(0, end - limit) : end])]

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """Through the lane's index of the newest record per job id."""
        queue = self.broker.lane(lane)
        seq = queue.dead_ids.get(job_id)
        if seq is None:
            return None
        index = bisect.bisect_left(queue.dead, seq, key=_seq)
        found: DlqRecord = queue.dead[index].copy()
        return found

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        queue = self.broker.lane(lane)
        index = bisect.bisect_left(queue.dead, seq, key=_seq)
        if index < len(queue.dead) and _seq(queue.dead[index]) == seq:
            queue.drop_dead(index)
            return True
        return False

    async def count_dead(self, lane: Lane) -> int:
        return len(self.broker.lane(lane).dead)

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        """A new message (its deliveries, the attempts, start again at 1), and the record
        (found by `seq`, else by id) deleted; one no longer there is requeued all the same."""
        queue = self.broker.lane(lane)
        seq = record.get("seq")
        for index, kept in enumerate(queue.dead):
            if kept.get("seq") == seq if seq is not None else kept["id"] == record["id"]:
                queue.drop_dead(index)
                break
        now_ms = clock.now_ms()
        subject = lane.subject if lane.kind == "job" else str(record["subject"])
        queue.put(
            MemoryMessage(
                record["id"],
                subject.removeprefix("events."),  # a record may name the NATS subject
                json.dumps(record["payload"], separators=(",", ":")).encode(),
                record.get("first_enqueued_at") or now_ms,
                now_ms,
                flow_key=record.get("flow_key"),
            )
        )

    async def purge(self, lane: Lane) -> int:
        queue = self.broker.lane(lane)
        count = len(queue.dead)
        queue.dead.clear()
        queue.dead_ids.clear()
        return count
