"""The `memory` bus: jobs and events in this process, for unit tests and for trying mega
without servers. The same retries, delays, dedup ids and dead letters as the other drivers;
what it cannot have is durability: everything stored lives and dies with the process, and
only this process can consume it. A new listener group replays the events the bus still keeps
(the last EVENTS_KEPT). Never a stand-in for a real bus in production.

    services = {"buses": {"jobs": {"driver": "memory"}}}
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar, Self

from mega.drivers.base import Lane, LaneStats, Message, pattern_matcher
from mega.drivers.memory.broker import MemoryBroker, MemoryMessage, queue_name
from mega.drivers.memory.dead import MemoryDeadLetters
from mega.drivers.memory.events import MemoryEventLog
from mega.drivers.memory.receiver import MemoryReceiver
from mega.drivers.memory.records import MemoryRecordStore
from mega.settings import BusSpec

logger = logging.getLogger("mega.drivers.memory")


class MemoryBus(MemoryDeadLetters, MemoryRecordStore, MemoryEventLog):
    """`Bus` in this process's memory (see mega.drivers.base): its lanes here, its dead
    letters, records and event log in its bases (dead.py, records.py, events.py); `native` is
    its MemoryBroker, one per bus. `MemoryBus(alias, spec)` makes one without the warning
    `connect` logs (what mega.testing's memory_context wants)."""

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
