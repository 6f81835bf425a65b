"""The consume loop: one lane (a job's queue, a listener group) in one process, on any driver.

The driver's `Receiver` hands over deliveries and settles them; the loop decides what starts
when, and `Executor` (mega/lanes/executor.py) runs each delivery to its settle:

- The slots: `concurrency` runs at a time. Each delivery runs the moment it arrives, in a task
  of its own: no waiting for a batch to fill, which is what keeps start latency low. The next
  `fetch` is in flight while the jobs of the last one run, so the engine's round trip is
  hidden behind them.
- The gates before a start: a delivery whose id or key no engine can be trusted with is refused
  (dead-lettered unrun); a cancelled job is settled unrun (the lane's cancel window is read
  beside each fetch); the lane's limits (mega/lanes/flow.py) admit what may start and hold the
  rest back as delayed messages; a paused lane holds what it fetched until it is resumed.
- The lease heartbeats: every running delivery's ack wait is extended each third of it.
- The watch: every second, the pause and the cancels of the running jobs (their runs cancelled).
- A stop drains: no more fetches, running jobs get up to the timeout, the rest are cancelled
  and handed back.
- Its presence record (presence.py) says every few seconds that it runs, how many deliveries
  run now and how many it settled; at the stop it says stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from mega import clock
from mega.drivers.base import Delivery, DriverUnavailable
from mega.lanes.control import WATCH_S, Unanswered
from mega.lanes.delivery import refusal
from mega.lanes.executor import (
    HAND_BACK_DELAY_S,
    Executor,
)
from mega.lanes.flow import Gate
from mega.lanes.presence import PRESENCE_EVERY_S, Presence
from mega.tasks import cancel_and_wait, wait_event

# The queue's logger: to an operator, the consume loop is part of the job queue.
logger = logging.getLogger("mega.jobqueue")

# The longest a fetch waits for its cancel read (and never over a quarter of the ack wait):
# an engine in an election must not hold fetched jobs until they are delivered again.
CANCEL_READ_S = 0.5
# How old a read of the cancel window may be when a fetch answers (else it is read again), and
# so how long before its delivery a cancel must have returned to stop a job from starting at
# all; one later is still honoured by the watch, which cancels the run within a second.
WINDOW_FRESH_S = 0.05

# How long a stopping loop waits to mark its presence record stopped.
PRESENCE_STOP_S = 2.0
# How long a stopping loop waits for its helper tasks (heartbeat, watch, presence), and for runs
# cancelled at the end of the drain, to end once cancelled.
LOOPS_STOP_S = 2.0


@dataclass(frozen=True)
class Window:
    """A read of the lane's cancel window, started beside a fetch."""

    read: asyncio.Task[None]
    started_at: float  # monotonic


class Lease:
    """A delivery being run, when its ack wait was last extended (monotonic s), and whether
    its job was cancelled (then its task is cancelled, and the delivery acked)."""

    __slots__ = ("cancelled", "delivery", "extended_at")

    def __init__(self, delivery: Delivery, extended_at: float) -> None:
        self.delivery = delivery
        self.extended_at = extended_at
        self.cancelled = False


class Consumer:
    """One lane's consume loop in this process: `run()` until `request_stop()` has drained it.

    It fetches through the executor's receiver, starts each delivery on `executor` (which runs
    it to its settle, mega/lanes/executor.py) within the spec's concurrency, and holds starts
    while the executor's `control` says the lane is paused. `presence` keeps its presence
    record and `gate` its limits (rate, per key).
    """

    def __init__(
        self, executor: Executor, *, presence: Presence | None = None, gate: Gate | None = None
    ) -> None:
        self.executor = executor
        executor.loop = self  # a run asks this loop to hold it while paused
        self.receiver = executor.receiver
        spec, records, control = executor.spec, executor.records, executor.control
        self.presence = presence
        self.gate = gate
        self.fetch_cap = gate.fetch_cap if gate is not None else None
        self.stop_requested = asyncio.Event()  # ends a wait for the rate limit at once
        self.settled = 0  # deliveries settled since the start (the presence record's `done`)
        self.records = records
        self.control = control
        self.resumed = asyncio.Event()  # cleared while the lane is paused
        self.resumed.set()
        self.spec = spec
        self.running: dict[asyncio.Task[None], Lease] = {}
        self.slot_free = asyncio.Event()
        self.stopping = False
        self.drain_timeout_s = 0.0
        self.closed = asyncio.Event()
        self.window: Window | None = None  # the latest read of the cancel window
        self.idle = False  # the last fetch brought nothing (see _fetch_loop)
        self.watch_unread = Unanswered(
            spec.name,
            "cannot read its pause and cancels (%s): it keeps the last ones it read until it can",
            "reads its pause and cancels again (%d read(s) failed)",
        )
        self.cancels_unread = Unanswered(  # beside each fetch: its jobs start unread
            spec.name,
            "cannot read its cancels (%s): its jobs start unread until it can",
            "reads its cancels again (%d fetch(es) started unread)",
        )

    def request_stop(self, timeout_s: float) -> None:
        self.stopping = True
        self.stop_requested.set()
        self.drain_timeout_s = timeout_s
        self.receiver.wake()
        self.slot_free.set()
        self.resumed.set()

    async def run(self) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        present = asyncio.create_task(self._present()) if self.presence is not None else None
        watch = None
        if self.control is not None:
            with contextlib.suppress(DriverUnavailable):  # the watch reads it again each second
                await self._refresh()  # a queue paused before this worker started stays so
            watch = asyncio.create_task(self._watch())
        try:
            await self._fetch_loop()
            await self._drain()
        finally:
            await cancel_and_wait([heartbeat, watch, present], LOOPS_STOP_S)
            if present is not None:
                await self._absent()
            for task in self.running:  # left only if run() itself was cancelled
                task.cancel()
            if self.records is not None:
                await self.records.close()
            if self.gate is not None:
                await self.gate.close()
            await self.receiver.close()
            self.closed.set()

    async def _fetch_loop(self) -> None:
        concurrency = self.spec.concurrency
        while not self.stopping:
            free = concurrency - len(self.running)
            if free <= 0:
                self.slot_free.clear()
                await self.slot_free.wait()
                continue
            if self.fetch_cap is not None:  # no more than the rate limit could let start
                free = min(free, self.fetch_cap)
            # The cancel window is read beside the fetch, not after it: no round trip added.
            # After an empty fetch the lane is idle: the next fetch may wait long, and a read
            # made before it would be stale when jobs come (and read again), so an idle lane
            # reads the window only once a fetch brings jobs (`_cancelled`).
            window = None if self.idle else self._read_window()
            deliveries = await self.receiver.fetch(free)
            self.idle = not deliveries
            if deliveries and any(map(refusal, deliveries)):
                deliveries = self._screened(deliveries)
            cancelled = await self._cancelled(deliveries, window)
            if self.gate is not None and deliveries:
                await self._start_gated(deliveries, cancelled)
                continue
            for delivery in deliveries:
                self._start(delivery, cancelled)

    def _screened(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries that may run; each other is refused in a task of its own."""
        runnable = []
        for delivery in deliveries:
            why = refusal(delivery)
            if why is None:
                runnable.append(delivery)
                continue
            task = asyncio.create_task(self.executor.refuse(delivery, why))
            self.running[task] = Lease(delivery, time.monotonic())
            task.add_done_callback(self._on_done)
        return runnable

    def _start(self, delivery: Delivery, cancelled: set[str] | tuple[()]) -> None:
        process = (
            self.executor.skip(delivery)
            if delivery.id in cancelled
            else self.executor.process(delivery)
        )
        if self.gate is not None and delivery.id not in cancelled:
            process = self._gated(process, delivery)
        task = asyncio.create_task(process)
        self.running[task] = Lease(delivery, time.monotonic())
        task.add_done_callback(self._on_done)

    async def _start_gated(
        self, deliveries: list[Delivery], cancelled: set[str] | tuple[()]
    ) -> None:
        """Start what the lane's limits admit of the fetched deliveries (a cancelled one needs
        no grant: it is not run) and hold the rest back as delayed messages, their attempt
        unchanged (see mega/lanes/flow.py). Once the runs began, their rate grants are stamped
        with the time; when the whole group's rate limit held some, the next fetch waits for
        its window."""
        gate = self.gate
        assert gate is not None
        runs = [delivery for delivery in deliveries if delivery.id not in cancelled]
        admission = await gate.admit(runs)
        for delivery in deliveries:
            if delivery.id in cancelled:
                self._start(delivery, cancelled)
        for delivery in admission.start:
            self._start(delivery, cancelled)
        if admission.start:
            await asyncio.sleep(0)  # the runs begin before their grants are stamped
        await gate.started(admission)
        if admission.held:
            await asyncio.gather(*(self._hold(d, due_s) for d, due_s in admission.held))
        if admission.wait_s > 0:
            await wait_event(self.stop_requested, admission.wait_s)

    async def _hold(self, delivery: Delivery, due_s: float) -> None:
        """Back to the queue as a delayed message due in `due_s`, attempt unchanged (a retry of
        `attempt - 1`)."""
        due_ms = int((clock.now() + due_s) * 1000)
        await self.receiver.retry(delivery, due_ms=due_ms, attempts=delivery.attempt - 1)

    async def _gated(self, process: Coroutine[Any, Any, None], delivery: Delivery) -> None:
        """Run `process`, then give up the lease its key holds (key_concurrency)."""
        assert self.gate is not None
        try:
            await process
        finally:
            self.gate.ended(delivery)

    async def held(self, delivery: Delivery) -> bool:
        """Hold a fetched delivery, its lease renewed, while the lane is paused; at a stop, hand
        it back (True)."""
        await self.resumed.wait()
        if not self.stopping:
            return False
        await self.receiver.release(delivery, delay_s=HAND_BACK_DELAY_S)
        return True

    def cancelled_run(self) -> bool:
        """Whether the run of the current task was cancelled because its job was."""
        lease = self.running.get(asyncio.current_task())  # type: ignore[arg-type]
        return lease is not None and lease.cancelled

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        if not task.cancelled():  # a cancelled one was handed back, not settled
            self.settled += 1
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: job task crashed", self.spec.name, exc_info=task.exception())
        self.slot_free.set()

    # -- control: cancels and the pause ------------------------------------------------------

    def _read_window(self) -> Window | None:
        """Start reading the lane's cancel window (see mega/lanes/control.py), unless a read
        started within `WINDOW_FRESH_S` (fetches come often when jobs are short: one read
        serves those that close together)."""
        if self.control is None or not self.control.on:
            return None
        last = self.window
        if last is not None and time.monotonic() - last.started_at < WINDOW_FRESH_S:
            return last
        read = asyncio.create_task(self.control.refresh_cancels())
        read.add_done_callback(_retrieved)  # one not awaited fails quietly: the next reads again
        self.window = Window(read, time.monotonic())
        return self.window

    async def _cancelled(
        self, deliveries: list[Delivery], window: Window | None
    ) -> set[str] | tuple[()]:
        """Which of the fetched jobs were cancelled, so that a cancel that returned before
        their fetch is seen: the window read beside the fetch, or read now when the fetch
        waited longer than `WINDOW_FRESH_S` for its jobs or the lane was idle (no read beside
        it); then, while it is open, their marks. A read that does not answer within
        `CANCEL_READ_S` starts them unread."""
        control = self.control
        if control is None or not control.on or not deliveries:
            return ()

        async def read() -> set[str]:
            if window is None or time.monotonic() - window.started_at > WINDOW_FRESH_S:
                await control.refresh_cancels()
            else:
                await window.read
            return await control.cancelled([delivery.id for delivery in deliveries])

        try:
            async with asyncio.timeout(min(CANCEL_READ_S, self.spec.ack_wait_s / 4)):
                found = await read()
        except (DriverUnavailable, TimeoutError) as exc:
            # Started unread: the watch still cancels a cancelled one within a second.
            self.cancels_unread.failed(exc)
            return ()
        self.cancels_unread.answered()
        return found

    async def _refresh(self) -> None:
        """Read the lane's pause and cancel window; a change of the pause holds or lets go
        the starts (`resumed`)."""
        assert self.control is not None
        was_paused = self.control.paused
        await self.control.refresh()
        if self.control.paused and not was_paused:
            self.resumed.clear()
            logger.info(
                "%s: paused: running jobs finish; up to %d fetched ones wait, none start",
                self.spec.name,
                self.spec.concurrency,
            )
        elif was_paused and not self.control.paused:
            self.resumed.set()
            logger.info("%s: resumed", self.spec.name)

    async def _watch(self) -> None:
        """Every WATCH_S: the pause (no new starts while it holds) and, while the cancel
        window is open, the cancels of the running jobs (their tasks are cancelled)."""
        assert self.control is not None
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                await self._refresh()
                cancelled = await self.control.cancelled(
                    [lease.delivery.id for lease in self.running.values() if not lease.cancelled]
                )
            except DriverUnavailable as exc:
                self.watch_unread.failed(exc)
                continue
            self.watch_unread.answered()
            for task, lease in list(self.running.items()):
                if lease.delivery.id in cancelled:
                    lease.cancelled = True
                    task.cancel()

    async def _heartbeat(self) -> None:
        """Extend the ack wait of every job running for a third of it (one task for all)."""
        interval_s = self.spec.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            extended = []
            for lease in list(self.running.values()):
                if now - lease.extended_at >= interval_s:
                    lease.extended_at = now
                    await self.receiver.extend(lease.delivery)
                    extended.append(lease.delivery)
            if self.gate is not None:
                await self.gate.renew(extended)

    async def _present(self) -> None:
        """Write this loop's presence record now and every PRESENCE_EVERY_S."""
        assert self.presence is not None
        while True:
            try:
                await self.presence.write(running=len(self.running), done=self.settled)
            except DriverUnavailable as exc:
                logger.debug("%s: presence record not written (%s)", self.spec.name, exc)
            await asyncio.sleep(PRESENCE_EVERY_S)

    async def _absent(self) -> None:
        """Mark the presence record stopped (bounded: a stop never waits on it for long)."""
        assert self.presence is not None
        try:
            async with asyncio.timeout(PRESENCE_STOP_S):
                await self.presence.write(running=0, done=self.settled, stopped=True)
        except (DriverUnavailable, TimeoutError) as exc:
            logger.debug("%s: presence record not marked stopped (%s)", self.spec.name, exc)

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while self.running and (remaining := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self.running), timeout=remaining)
        if await cancel_and_wait(list(self.running), LOOPS_STOP_S):
            logger.warning("%s: a run went on after its cancel; left to the exit", self.spec.name)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
