"""The `memory` bus: jobs and events in this process, for unit tests and for trying mega
without servers. The same retries, delays, dedup ids and dead letters as the other drivers;
what it cannot have is durability: everything stored lives and dies with the process, and
only this process can consume it. A new listener group replays the events the bus still keeps
(the last EVENTS_KEPT). Never a stand-in for a real bus in production.

    services = {"buses": {"jobs": {"driver": "memory"}}}
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, Self

from mega import clock
from mega.drivers.base import DlqRecord, Lane, LaneStats, Message, Table, pattern_matcher
from mega.drivers.memory.broker import MemoryBroker, MemoryMessage, queue_name
from mega.drivers.memory.receiver import MemoryReceiver
from mega.settings import BusSpec

logger = logging.getLogger("mega.drivers.memory")


async def _not_watching() -> None:
    return None


def _seq(record: DlqRecord) -> int:
    return record.get("seq", 0)


class MemoryBus:
    """`Bus` in this process's memory (see mega.drivers.base); `native` is its MemoryBroker,
    one per bus. `MemoryBus(alias, spec)` makes one without the warning `connect` logs (what
    mega.testing's memory_context wants)."""

    driver: ClassVar[str] = "memory"
    fair_lanes: ClassVar[bool] = True
    priority_lanes: ClassVar[bool] = True

    def __init__(self, alias: str, spec: BusSpec, broker: MemoryBroker | None = None) -> None:
        self.alias = alias
        self.spec = spec
        self.broker = broker if broker is not None else MemoryBroker()

    @property
    def native(self) -> MemoryBroker:
        return self.broker

    @property
    def connected(self) -> bool:
        return True

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        """A fresh broker. Said at start: nothing on it outlives the process."""
        logger.warning(
            "bus %r is in memory: its jobs and events live and die with this process, and no "
            "other process sees them (fine for tests and trying things; use the nats driver "
            "for real work)",
            alias,
        )
        return cls(alias, spec)

    async def close(self) -> None:
        return None

    async def ping(self) -> None:
        return None

    # -- lanes --------------------------------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The lane's queue; a new listener group's filled with the kept events it matches."""
        queue = self.broker.lane(lane)
        if lane.kind == "job" or lane.name in self.broker.groups:
            return
        matches = pattern_matcher(lane.subject)
        self.broker.groups[lane.name] = (matches, queue_name(lane))
        for name, event_id, body, emitted, trace in self.broker.events:
            if matches(name):
                queue.put(MemoryMessage(event_id, name, body, emitted, emitted, trace=trace))

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        queue = self.broker.lane(lane)
        kept: list[bool] = []
        for message in messages:
            if message.dedup and self.broker.seen(message.id):
                kept.append(False)
                continue
            run_at = max(message.enqueued_at_ms, message.run_at_ms or 0)
            stored = MemoryMessage(
                message.id,
                message.subject,
                message.body,
                message.enqueued_at_ms,
                run_at,
                trace=message.trace,
                flow_key=message.flow_key,
                priority=message.priority,
            )
            queue.put(stored, at_ms=message.run_at_ms)
            kept.append(True)
        return kept

    async def stats(self, lane: Lane) -> LaneStats:
        return self.broker.lane(lane).stats()

    def receiver(self, lane: Lane, *, consumer: str) -> MemoryReceiver:
        return MemoryReceiver(self.broker.lane(lane), lane)

    # -- dead letters -------------------------------------------------------------------------

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

    # -- records ------------------------------------------------------------------------------

    async def put_records(
        self,
        lane: Lane,
        table: Table,
        records: Sequence[tuple[str, bytes]],
        *,
        create: bool,
        confirm: bool = True,
    ) -> list[bool]:
        store = self.broker.table(lane, table)
        now = clock.monotonic()
        expires = now + lane.keep_s(table)
        stored: list[bool] = []
        for key, value in records:
            kept = store.get(key)
            if create and kept is not None and kept[1] > now:
                stored.append(False)
                continue
            store[key] = (value, expires)
            stored.append(True)
        return stored

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        store, now = self.broker.table(lane, table), clock.monotonic()
        found: list[bytes | None] = []
        for key in keys:
            kept = store.get(key)
            found.append(kept[0] if kept is not None and kept[1] > now else None)
        return found

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        store, now = self.broker.table(lane, table), clock.monotonic()
        return [(key, value) for key, (value, expires) in store.items() if expires > now]

    # -- events -------------------------------------------------------------------------------

    async def ensure_events(self, *, max_age_s: float) -> None:
        return None  # kept by count (EVENTS_KEPT), not by age

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        kept: list[bool] = []
        for message in messages:
            if self.broker.seen(message.id):
                kept.append(False)
                continue
            name, event_id, body, emitted, trace = (
                message.subject,
                message.id,
                message.body,
                message.enqueued_at_ms,
                message.trace,
            )
            self.broker.events.append((name, event_id, body, emitted, trace))
            for matches, queue in self.broker.groups.values():
                if matches(name):
                    self.broker.subject(queue).put(
                        MemoryMessage(event_id, name, body, emitted, emitted, trace=trace)
                    )
            kept.append(True)
        return kept

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        return _not_watching  # one process: its own commits wake its relay

    def announce_commit(self) -> None:
        return None
