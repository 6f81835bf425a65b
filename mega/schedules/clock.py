"""The timetable loop of one Scheduler: every cron ticking here (each class's own, each dynamic
entry's) is a line in one `Timetable`; one task sleeps until the first instant, fires every
line due then, and puts each back at its next instant. A line reached more than
`LATE_LIMIT_S` late is a missed tick (recorded, not run). The locked ticks due at once on one
lock read their pauses in one round trip. One reader per lock follows the dynamic entries and
adds, restarts or drops their lines."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

from mega import clock as time_source  # the machine's, or a test's FakeClock
from mega.context import Context
from mega.schedules.dynamic import ScheduleEntry, changes, entry_spec, watch_entries
from mega.schedules.schedule import LockPlan, ScheduleSpec
from mega.schedules.ticks import Ticks
from mega.schedules.timetable import Line, Timetable
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.scheduler")

_T = TypeVar("_T")

# An instant reached more than this late (event loop stalled, host suspended) counts as missed
# and is not fired: a burst of stale ticks would be worse than a gap.
LATE_LIMIT_S = 1.0
# Longest single sleep, so a wall-clock step (NTP) is noticed within this delay.
MAX_SLEEP_S = 30.0
# After an unexpected error in a loop, wait this long before going on.
LOOP_RETRY_S = 1.0


class Clock:
    """Fires the ticks of `specs` (the Scheduler's, by name) through `ticks` while started."""

    def __init__(self, ctx: Context, specs: dict[str, ScheduleSpec], ticks: Ticks) -> None:
        self.ctx = ctx
        self.specs = specs
        self.ticks = ticks
        self.table = Timetable()  # every cron ticking here, by next instant
        self.task: asyncio.Task[None] | None = None  # the one loop that fires what is due
        self.wake = asyncio.Event()  # set when a line is added: the clock sleeps again
        self.lines: dict[str, Line] = {}  # the class's own cron, by name
        # The dynamic entries ticking here, by name then key, each with its line.
        self.entry_lines: dict[str, dict[str, tuple[ScheduleEntry, Line]]] = {}
        self.watchers: dict[str, asyncio.Task[None]] = {}  # the entries' watch, by lock alias
        self.runs: set[asyncio.Task[Any]] = set()  # the ticks going on
        self.started = False

    def start(self) -> None:
        """Tick every schedule of `specs` (idempotent)."""
        self.started = True
        for spec in self.specs.values():
            self.add(spec)
        if self.task is None:
            self.task = self._spawn("clock", self._run_clock)

    async def stop(self) -> None:
        """No new ticks (the runs going on are the caller's to wait for: `runs`)."""
        self.started = False
        loops = [*self.watchers.values(), *([self.task] if self.task else [])]
        self.task = None
        self.table = Timetable()
        self.lines.clear()
        self.watchers.clear()
        self.entry_lines.clear()
        await cancel_and_wait(loops)

    def add(self, spec: ScheduleSpec) -> None:
        """Tick `spec` here: its cron's line, and a reader of its lock's dynamic entries."""
        if spec.cron is not None and spec.name not in self.lines:
            self.lines[spec.name] = self.table.add(spec, spec.cron)
            self.wake.set()
        if spec.lock is not None and spec.lock.alias not in self.watchers:
            alias = spec.lock.alias
            watch = functools.partial(
                watch_entries,
                self.ctx.lock(alias).native,
                alias,
                functools.partial(self._entry_plans, alias),
                self._apply_entries,
            )
            self.watchers[alias] = self._spawn(f"entries on lock {alias}", watch)

    def _entry_plans(self, alias: str) -> dict[str, LockPlan]:
        """The classes whose entries the reader of lock `alias` follows, by name."""
        return {
            spec.name: spec.lock
            for spec in self.specs.values()
            if spec.lock is not None and spec.lock.alias == alias
        }

    def _spawn(self, label: str, body: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        return asyncio.create_task(self._forever(label, body), name=f"mega.schedule:{label}")

    async def _forever(self, label: str, body: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await body()
            except Exception:
                # A bug here must not silently end the ticking: log, pause, start over from now.
                logger.exception("scheduler %s: loop error; restarting", label)
                await asyncio.sleep(LOOP_RETRY_S)

    def _apply_entries(self, name: str, stored: dict[str, ScheduleEntry]) -> None:
        """Start, restart and stop the entries' lines here to match `stored`."""
        spec = self.specs[name]
        lines = self.entry_lines.setdefault(name, {})
        stop, start = changes({key: entry for key, (entry, _) in lines.items()}, stored)
        for key in stop:
            self.table.remove(lines.pop(key)[1])  # only the line: a run already going finishes
            if key not in stored:
                logger.info("schedule %r key %r: removed, no more ticks here", name, key)
        for entry in start:
            ticked = entry_spec(spec, entry)
            lines[entry.key] = (entry, self.table.add(ticked, entry.cron))
            self.wake.set()
            logger.info(
                "schedule %r key %r: ticking on %r in %s",
                name,
                entry.key,
                ticked.cron,
                ticked.timezone or f"host local time ({ticked.zone})",
            )

    async def _run_clock(self) -> None:
        """Sleep until the first planned instant (or a new line), then fire all that is due."""
        while True:
            self.wake.clear()
            first = self.table.next_at()
            now = time_source.now()
            wait_s = MAX_SLEEP_S if first is None else min(first - now, MAX_SLEEP_S)
            if wait_s > 0:
                await time_source.current().wait(self.wake, wait_s)
                continue
            self._fire(self.table.take_due(now))

    def _fire(self, lines: list[Line]) -> None:
        """Start the tick of each line due, and put each back at its next instant. The locked
        ones go in one batch per lock: their pause records are read in one round trip."""
        now = time_source.now()
        batches: dict[str, list[tuple[ScheduleSpec, datetime]]] = {}
        for line in lines:
            spec, planned, late_s = line.spec, line.planned, now - line.at
            try:
                if late_s > LATE_LIMIT_S:
                    self.track(self.ticks.missed(spec, planned, late_s))
                elif spec.lock is None:
                    self.track(self.ticks.tick(spec, planned, "schedule"))
                else:
                    batches.setdefault(spec.lock.alias, []).append((spec, planned))
            finally:
                # From the planned instant, not from now: a late wake-up never drifts the
                # schedule; a missed one goes on from now (missed instants are not replayed).
                if late_s > LATE_LIMIT_S:
                    self.table.skip_to_now(line)
                else:
                    self.table.advance(line)
        for alias, due in batches.items():
            self.track(self._tick_batch(alias, due))

    async def _tick_batch(self, alias: str, due: list[tuple[ScheduleSpec, datetime]]) -> None:
        """The ticks due at once on the lock `alias`: their pauses in one read, then each."""
        plans = [spec.lock for spec, _ in due if spec.lock is not None]
        paused = await self.ticks.read_pauses(alias, plans)
        if not self.started:
            return  # stopped while reading: no new run
        for (spec, planned), is_paused in zip(due, paused, strict=True):
            self.track(self.ticks.tick(spec, planned, "schedule", paused=is_paused))

    def track(self, tick: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        task = asyncio.create_task(tick)
        self.runs.add(task)
        task.add_done_callback(self.runs.discard)
        return task
