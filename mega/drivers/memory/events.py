"""The memory bus's event log (`EventLog` of mega.drivers.base): the last EVENTS_KEPT events
in its broker, each copied to the queue of every listener group whose pattern matches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from mega.drivers.base import Message
from mega.drivers.memory.broker import MemoryBroker, MemoryMessage


async def _not_watching() -> None:
    return None


class MemoryEventLog:
    """The events of a MemoryBus, on its `broker`."""

    broker: MemoryBroker

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
