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
        planned = _utc(cron.next(expr, after=after, tz=spec.zone))
        line = Line(planned.timestamp(), next(self._order), spec, expr, planned)
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
        self._push_after(line, line.planned)

    def skip_to_now(self, line: Line) -> None:
        """Back in, at the first instant after now: missed instants are not replayed."""
        self._push_after(line, None)

    def _push_after(self, line: Line, after: datetime | None) -> None:
        if line.removed:
            return
        line.planned = _utc(cron.next(line.expr, after=after, tz=line.spec.zone))
        line.at = line.planned.timestamp()
        heapq.heappush(self._heap, line)

    def _drop_removed(self) -> None:
        while self._heap and self._heap[0].removed:
            heapq.heappop(self._heap)


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)
