"""The time mega decides by: the wall clock, a monotonic clock, and waits on them.

Everything in mega that decides by time reads it here: a delayed job's and a retry's due time,
the pause and cancel windows, a record's keep, a dead letter's time, the dedup window of the
memory driver, a schedule's next instant, a login's wait and a session's expiry. A test can
then drive time instead of waiting for it: `mega.testing.fake_clock()` puts a `FakeClock` in
place, which moves only when told.

    with fake_clock() as clock:
        await Reminder.enqueue({...}, delay=3600)
        await clock.advance(3600)          # the job is due now; nothing slept

What does not read it, on purpose: the servers' own times (a NATS ack wait, a Redis key's TTL, a
PostgreSQL lease), the time limit of a run and the waits of a stop or a reconnect. Those are
about a real process on a real machine, and a test of them runs on real time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TypeVar

from mega.tasks import wait_event


class Timer:
    """A callback due at a time; `cancel()` before then and it never runs."""

    __slots__ = ("callback", "cancelled", "handle")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False
        self.handle: asyncio.TimerHandle | None = None  # the loop's, on the machine's clock

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()


class Clock:
    """The machine's clocks: what mega reads unless a test puts a FakeClock in place."""

    def time(self) -> float:
        """Seconds since the epoch (time.time)."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds of a clock that never steps back (time.monotonic)."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay_s: float, callback: Callable[[], object]) -> Timer:
        """Call `callback` in `delay_s` on the running loop."""
        timer = Timer(callback)
        timer.handle = asyncio.get_running_loop().call_later(delay_s, _run, timer)
        return timer

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Until `event` is set, up to `timeout_s`; whether it was."""
        return await wait_event(event, timeout_s)


def _run(timer: Timer) -> None:
    if not timer.cancelled:
        timer.callback()


class FakeClock(Clock):
    """A clock that stands still until `advance` moves it: its sleeps, timers and waits end when
    the time they wait for is reached, in order, each given the loop to run what it wakes."""

    def __init__(self, start: datetime | None = None) -> None:
        self._time = (start or datetime.now(UTC)).timestamp()
        self._monotonic = time.monotonic()
        self._timers: list[tuple[float, int, Timer]] = []  # (monotonic due, order, timer)
        self._order = itertools.count()

    def time(self) -> float:
        return self._time

    def monotonic(self) -> float:
        return self._monotonic

    def now(self) -> datetime:
        """The fake wall clock as an aware datetime in UTC."""
        return datetime.fromtimestamp(self._time, UTC)

    def call_later(self, delay_s: float, callback: Callable[[], object]) -> Timer:
        timer = Timer(callback)
        due = self._monotonic + max(delay_s, 0.0)
        heapq.heappush(self._timers, (due, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await woken
        finally:
            timer.cancel()

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiter, sleeper):
                task.cancel()
        return event.is_set()

    async def advance(self, seconds: float) -> None:
        """Move both clocks `seconds` on. Each timer due on the way fires at its own time, in
        order, and the loop runs what it woke (a timer that sets another one within the span
        fires too) before the clock goes on."""
        if seconds < 0:
            raise ValueError(f"a clock moves forward only: advance({seconds})")
        end = self._monotonic + seconds
        await settle()
        while self._timers and self._timers[0][0] <= end:
            due, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._step_to(due)
            timer.callback()
            await settle()
        self._step_to(end)
        await settle()

    def pending(self) -> int:
        """How many timers wait for the clock (cancelled ones not counted)."""
        return sum(not timer.cancelled for _, _, timer in self._timers)

    def _step_to(self, monotonic: float) -> None:
        step = max(monotonic - self._monotonic, 0.0)
        self._monotonic += step
        self._time += step


async def settle() -> None:
    """Let every runnable task of the loop run until none is left runnable."""
    for _ in range(20):
        await asyncio.sleep(0)


_clock: Clock = Clock()
C = TypeVar("C", bound=Clock)


def current() -> Clock:
    """The clock mega reads now."""
    return _clock


def now() -> float:
    """Epoch seconds on the current clock."""
    return _clock.time()


def now_ms() -> int:
    """Epoch milliseconds on the current clock."""
    return int(_clock.time() * 1000)


def utcnow() -> datetime:
    """The current clock's time as an aware datetime in UTC."""
    return datetime.fromtimestamp(_clock.time(), UTC)


def monotonic() -> float:
    return _clock.monotonic()


async def sleep(seconds: float) -> None:
    await _clock.sleep(seconds)


@contextlib.contextmanager
def using(clock: C) -> Iterator[C]:
    """Make `clock` the one mega reads within the block (the machine's again after)."""
    global _clock
    before, _clock = _clock, clock
    try:
        yield clock
    finally:
        _clock = before
