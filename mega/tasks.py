"""Stopping asyncio tasks for certain, on Python 3.11 too.

Python 3.11's `asyncio.wait_for` returns the result of what it waited on when that finished in
the same turn of the loop as a cancel of the waiting task: the cancel is lost, and the task goes
on (fixed in 3.12, where wait_for is built on `asyncio.timeout`). Libraries await wait_for deep
inside their calls (redis-py around each command it sends), so a single cancel of a loop that
talks to Redis is lost often: of 2,000 cancels of a task awaiting redis-py's `get`, about half
did not stop it. A scheduler stopped just after it started then waited for such a loop forever.

So the framework's own waits use `asyncio.timeout` (`wait_event`), a task it stops is cancelled
again while it goes on (`cancel_and_wait`), as anyio's cancel scopes do, and a job's time limit
(`TimeLimit`) cancels its run again until it ends: with `asyncio.timeout`, 65 of 100 runs that
awaited redis-py in a loop went on past a limit of 20 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any

# A task still going this long after a cancel is cancelled again: long enough for the cleanup
# of a task that took its cancel (a release, a last write), short enough to stop promptly.
RECANCEL_AFTER_S = 0.2
# A time limit's cancel sent again goes on this many turns of the loop in a row, as anyio's
# cancel scopes do on every turn: on a process short of CPU, each time it runs again the
# overdue cancel and the Redis reply it waited for come in the same turn, and a single cancel
# was lost each time (5 runs of 20 outlived a 10 ms limit by 5 s with the cores busy).
RECANCEL_TURNS = 8


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any] | None], timeout_s: float | None = None
) -> set[asyncio.Future[Any]]:
    """Cancel `tasks` (None are skipped) and wait until they end, cancelling again each
    RECANCEL_AFTER_S the ones that go on; up to `timeout_s` in all (None: until they end).
    Returns the ones still going at the deadline. Never raises what a task raised."""
    pending = {task for task in tasks if task is not None and not task.done()}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        wait_s = RECANCEL_AFTER_S
        if deadline is not None:
            wait_s = min(wait_s, deadline - time.monotonic())
            if wait_s <= 0:
                break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait_s)
    return pending


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set, up to `timeout_s`; whether it was. A cancel of the waiting
    task always stops it (asyncio.wait_for's may be lost on Python 3.11, see above)."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


class TimeLimit:
    """`asyncio.timeout(timeout_s)` for code that may lose a cancel (a job's run): past the
    deadline the task is cancelled, and again each RECANCEL_AFTER_S until the block ends; the
    block then raises TimeoutError (`expired()` is True). A block that ends on its own after
    the deadline (every cancel lost) ends as it ended, as with asyncio.timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sent = 0
        self._handle: asyncio.Handle | None = None

    def expired(self) -> bool:
        return self._sent > 0

    async def __aenter__(self) -> TimeLimit:
        task = asyncio.current_task()
        assert task is not None, "TimeLimit is used inside a task"
        self._task, self._cancelling = task, task.cancelling()
        self._handle = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        return self

    def _expire(self) -> None:
        """The first cancel once (the block may take it and clean up); each one after it on
        RECANCEL_TURNS turns in a row, then again RECANCEL_AFTER_S later."""
        self._cancel(RECANCEL_TURNS if self._sent else 1)

    def _cancel(self, turns: int) -> None:
        self._sent += 1
        self._task.cancel()
        loop = asyncio.get_running_loop()
        if turns > 1:
            self._handle = loop.call_soon(self._cancel, turns - 1)
        else:
            self._handle = loop.call_later(RECANCEL_AFTER_S, self._expire)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        for _ in range(self._sent):  # ours, not a cancel from elsewhere
            self._task.uncancel()
        only_ours = self._task.cancelling() <= self._cancelling  # none from elsewhere pending
        if self._sent and kind is asyncio.CancelledError and only_ours:
            raise TimeoutError from exc
