"""mega.schedules.timetable: the one heap of a Scheduler's crons (pure, no clock, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

from mega.schedules.schedule import Schedule, ScheduleSpec, validate_schedule
from mega.schedules.timetable import Timetable

NOON = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def spec(name: str, expr: str, timezone: str = "UTC") -> ScheduleSpec:
    class Probe(Schedule):
        cron = expr

        async def run(self, ctx: object) -> None:
            return None

    Probe.name = name
    Probe.timezone = timezone
    return validate_schedule(Probe, [])


def test_lines_come_due_in_instant_order_and_all_due_come_at_once() -> None:
    table = Timetable()
    minutely = table.add(spec("Minutely", "* * * * *"), "* * * * *", after=NOON)
    secondly = table.add(spec("Secondly", "* * * * * *"), "* * * * * *", after=NOON)
    also = table.add(spec("Also", "* * * * * *"), "* * * * * *", after=NOON)
    assert table.next_at() == NOON.timestamp() + 1
    assert table.take_due(NOON.timestamp() + 0.999) == []
    assert table.take_due(NOON.timestamp() + 1) == [secondly, also]  # ties: first added first
    assert table.next_at() == NOON.timestamp() + 60
    assert table.take_due(NOON.timestamp() + 60) == [minutely]
    assert len(table) == 0  # taken lines are out until put back


def test_advance_goes_on_from_the_planned_instant_and_skip_to_now_from_now() -> None:
    table = Timetable()
    line = table.add(spec("Every5", "*/5 * * * * *"), "*/5 * * * * *", after=NOON)
    assert table.take_due(NOON.timestamp() + 5) == [line]
    table.advance(line)  # planned 12:00:05: next 12:00:10, however late this runs
    assert line.planned == datetime(2026, 12, 3, 12, 0, 10, tzinfo=UTC)
    assert table.take_due(NOON.timestamp() + 10) == [line]
    before = datetime.now(UTC).timestamp()
    table.skip_to_now(line)  # from the real clock: instants missed are not replayed
    assert before < line.at <= datetime.now(UTC).timestamp() + 5
    assert table.next_at() == line.at


def test_a_removed_line_never_comes_due_again() -> None:
    table = Timetable()
    kept = table.add(spec("Kept", "* * * * * *"), "* * * * * *", after=NOON)
    gone = table.add(spec("Gone", "* * * * * *"), "* * * * * *", after=NOON)
    table.remove(gone)
    assert len(table) == 1
    assert table.take_due(NOON.timestamp() + 1) == [kept]
    table.advance(gone)  # a line removed while out of the heap is not put back
    table.advance(kept)
    assert table.take_due(NOON.timestamp() + 2) == [kept]


def test_a_line_ticks_in_its_own_zone() -> None:
    table = Timetable()
    line = table.add(spec("Paris", "0 6 * * *", "Europe/Paris"), "0 6 * * *", after=NOON)
    assert line.planned == datetime(2026, 12, 4, 5, 0, tzinfo=UTC)  # 06:00 in Paris (UTC+1)
