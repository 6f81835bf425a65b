"""The `memory` driver of events: emit and listen in this process, for unit tests and for
trying mega without servers. The same Event and Listener classes, signals, retries, dead letters
and DLQ tools as on NATS (the job driver's `MemoryConsumer` runs each group); a new group
replays the events the bus still keeps (the last EVENTS_KEPT). Nothing outlives the process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mega.context import Context
from mega.events.bus import EventBus, RunEvent, not_watching
from mega.events.event import SUBJECT_PREFIX, EventMessage, ReceivedEvent
from mega.events.listener import Listener, ListenerSpec, subject_matcher
from mega.jobs.memory import (
    MemoryConsumer,
    MemoryDeadLetters,
    MemoryLane,
    MemoryMessage,
    memory_broker,
)
from mega.jobs.queue import JobStats


def _queue_name(spec: ListenerSpec) -> str:
    return f"group:{spec.group}"  # never a job subject (those have no `:`)


class MemoryEventBus(EventBus):
    """EventBus on a memory bus: see the module's docstring."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        self.broker = memory_broker(ctx, bus_alias)
        self.consumer = MemoryConsumer(self.instance_id, self.signal)

    @property
    def dlq(self) -> MemoryDeadLetters:
        return MemoryDeadLetters(self._queue)

    async def _queue(self, listener_cls: type[Any]) -> MemoryLane:
        return self.broker.subject(_queue_name(await self.ensure(listener_cls)))

    @property
    def connected(self) -> bool:
        return True

    async def ensure_stream(self) -> None:
        return None

    async def ensure(self, listener_cls: type[Listener], *, force: bool = False) -> ListenerSpec:
        """A new group's queue, filled with the kept events its pattern matches."""
        spec = self.spec(listener_cls)
        name = _queue_name(spec)
        if spec.group not in self.broker.groups:
            matches = subject_matcher(spec.pattern)
            self.broker.groups[spec.group] = (matches, name)
            queue = self.broker.subject(name)
            for subject, event_id, body, emitted in self.broker.events:
                if matches(subject):
                    queue.put(MemoryMessage(event_id, subject, body, emitted, emitted))
        return spec

    async def publish(self, message: EventMessage) -> bool:
        kept = self._publish(message)
        event = message.subject.removeprefix(SUBJECT_PREFIX)
        await self.signal("emit", event=event, id=message.event_id, duplicate=not kept)
        return kept

    async def publish_many(self, messages: list[EventMessage]) -> None:
        for message in messages:
            self._publish(message)

    def _publish(self, message: EventMessage) -> bool:
        if self.broker.seen(message.event_id):
            return False
        event_id, subject, body, emitted = (
            message.event_id, message.subject, message.body, message.emitted_at_ms
        )  # fmt: skip
        self.broker.events.append((subject, event_id, body, emitted))
        for matches, name in self.broker.groups.values():
            if matches(subject):
                message_of_group = MemoryMessage(event_id, subject, body, emitted, emitted)
                self.broker.subject(name).put(message_of_group)
        return True

    async def stats(self, listener_cls: type[Listener]) -> JobStats:
        return (await self._queue(listener_cls)).stats()

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        return not_watching  # one process: its own commits wake its relay

    def announce_commit(self) -> None:
        return None

    async def _listen(self, spec: ListenerSpec, run_event: RunEvent) -> None:
        async def run(payload: Any, message: MemoryMessage, attempt: int) -> None:
            await run_event(
                ReceivedEvent(
                    id=message.job_id,
                    name=message.subject.removeprefix(SUBJECT_PREFIX),
                    data=payload,
                    emitted_at=message.enqueued_at_ms,
                    attempt=attempt,
                )
            )

        await self.consumer.run(spec, self.broker.subject(_queue_name(spec)), run)

    async def _stop(self, timeout_s: float) -> None:
        await self.consumer.stop(timeout_s)


EventBus.drivers["memory"] = MemoryEventBus
