"""The Timetable: every cron a Scheduler ticks, in one heap, ordered by the next planned instant.

One loop sleeps until the first instant, takes every instant that is due at once, and puts each
cron back at its next instant: so a scheduler of 10,000 schedules keeps one timer and one task,
not one of each per schedule, and the schedules due at the same instant are handled together
(their pause records read in one round trip). A line is removed by marking it: the heap drops
it when it comes to the top.

    table = Timetable()
    line = table.add(spec, "*/5 * * * *")
    due = table.take_due(time.time())      # the lines whose instant has come, first ones first
    table.advance(line)                    # on to its next instant, from the planned one
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mega.schedules import cron
from mega.schedules.schedule import ScheduleSpec


@dataclass(order=True)
class Line:
    """One cron ticking here: the class's own (`spec.key` None) or one dynamic entry's."""

    at: float  # the planned instant, epoch seconds
    order: int  # ties: first added first
    spec: ScheduleSpec = field(compare=False)
    expr: str = field(compare=False)  # the cron (a class's own may be None, so given apart)
    planned: datetime = field(compare=False)
    # The instants after `planned`, read from the cron once (not parsed again at each one).
    upcoming: Iterator[datetime] = field(compare=False, repr=False)
    removed: bool = field(default=False, compare=False)


class Timetable:
    """Lines by next planned instant. Pure: no clock of its own, no I/O."""

    def __init__(self) -> None:
        self._heap: list[Line] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return sum(not line.removed for line in self._heap)

    def add(self, spec: ScheduleSpec, expr: str, after: datetime | None = None) -> Line:
        """A line for `expr` in `spec`'s zone, at its first instant after `after` (now)."""
        upcoming = cron.instants(expr, after=after, tz=spec.zone)
        planned = _first(upcoming, expr)
        line = Line(planned.timestamp(), next(self._order), spec, expr, planned, upcoming)
        heapq.heappush(self._heap, line)
        return line

    def remove(self, line: Line) -> None:
        line.removed = True

    def next_at(self) -> float | None:
        """The first planned instant (epoch seconds), None with no line."""
        self._drop_removed()
        return self._heap[0].at if self._heap else None

    def take_due(self, now: float) -> list[Line]:
        """Every line planned at `now` or before, out of the heap, first instants first. Put
        each back with `advance` (or `skip_to_now` when it comes too late)."""
        due = []
        self._drop_removed()
        while self._heap and self._heap[0].at <= now:
            due.append(heapq.heappop(self._heap))
            self._drop_removed()
        return due

    def advance(self, line: Line) -> None:
        """Back in, at the instant after its planned one: a late tick never drifts the cron."""
        if not line.removed:
            self._push(line, _first(line.upcoming, line.expr))

    def skip_to_now(self, line: Line) -> None:
        """Back in, at the first instant after now: missed instants are not replayed."""
        if not line.removed:
            line.upcoming = cron.instants(line.expr, tz=line.spec.zone)
            self._push(line, _first(line.upcoming, line.expr))

    def _push(self, line: Line, planned: datetime) -> None:
        line.planned, line.at = planned, planned.timestamp()
        heapq.heappush(self._heap, line)

    def _drop_removed(self) -> None:
        while self._heap and self._heap[0].removed:
            heapq.heappop(self._heap)


def _first(upcoming: Iterator[datetime], expr: str) -> datetime:
    """The next instant, in UTC; CronError when the expression has no more (checked at
    registration, so only a cron that stops within the century ends here)."""
    instant = next(upcoming, None)
    if instant is None:
        raise cron.CronError(f"cron expression {expr!r} has no run after now")
    return instant.astimezone(UTC)
