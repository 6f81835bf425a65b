"""One lane consumed in this process on a memory bus."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable

from mega import clock
from mega.drivers.base import Delivery, DlqRecord, DriverUnavailable, Lane
from mega.drivers.memory.broker import MemoryLane, MemoryMessage

# How long a fetch waits for a message before it returns [].
FETCH_WAIT_S = 0.5


class MemoryReceiver:
    """`Receiver` of one memory lane (see mega.drivers.base). There is no ack wait here: a
    delivery stays this receiver's until it is settled, and `close()` puts back the ones that
    never were (first in line), as a dead worker's come back on the other engines."""

    def __init__(self, queue: MemoryLane, lane: Lane) -> None:
        self.queue = queue
        self.lane = lane
        self._woken = False
        self._unsettled: dict[Hashable, MemoryMessage] = {}  # message key -> message

    async def fetch(self, limit: int) -> list[Delivery]:
        if not self._woken and not self.queue.ready and limit > 0:
            self.queue.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FETCH_WAIT_S):
                    await self.queue.wakeup.wait()
        if self._woken:
            self._woken = False
            return []
        found: list[Delivery] = []
        while self.queue.ready and len(found) < limit:
            message = self.queue.ready.popleft()
            message.deliveries += 1
            self.queue.take(message)
            self._unsettled[message.key] = message
            found.append(
                Delivery(
                    id=message.job_id,
                    subject=message.subject,
                    body=message.body,
                    attempt=message.base + message.deliveries,
                    enqueued_at_ms=message.enqueued_at_ms,
                    run_at_ms=message.run_at_ms,
                    key=message.key,
                    handle=message,
                    trace=message.trace,
                    flow_key=message.flow_key,
                )
            )
        return found

    def wake(self) -> None:
        self._woken = True
        self.queue.wakeup.set()

    async def ack(self, delivery: Delivery) -> None:
        self._settle(delivery)

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        """The same message, due at `due_ms`, its deliveries counted again from `attempts`."""
        message = self._settle(delivery)
        if message is None:
            return
        message.base, message.deliveries, message.run_at_ms = attempts, 0, due_ms
        message.trace = delivery.trace
        self.queue.put(message, at_ms=due_ms)

    async def extend(self, delivery: Delivery) -> None:
        return None  # no ack wait: a delivery is this receiver's until settled

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        """Back in the queue after `delay_s` (now: first in line); its next delivery counts."""
        message = self._settle(delivery)
        if message is None:
            return
        if delay_s <= 0:
            self.queue.put(message, first=True)
        else:
            self.queue.put(message, at_ms=int((clock.now() + delay_s) * 1000))

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        """Stored through `MemoryLane.dead_letter` (a copy of the record, given its `seq`);
        when that raises, DriverUnavailable and the delivery stays unsettled."""
        if delivery.key not in self._unsettled:
            return
        try:
            self.queue.dead_letter(record.copy())
        except Exception as exc:
            raise DriverUnavailable(f"{self.lane.name}: dead letter not stored: {exc}") from exc
        self._settle(delivery)

    async def close(self) -> None:
        for message in reversed(list(self._unsettled.values())):
            self.queue.settle(message)
            self.queue.put(message, first=True)
        self._unsettled.clear()

    def _settle(self, delivery: Delivery) -> MemoryMessage | None:
        """The delivery's message, settled once (a second settling call does nothing)."""
        message = self._unsettled.pop(delivery.key, None)
        if message is not None:
            self.queue.settle(message)
        return message
