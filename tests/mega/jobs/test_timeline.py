"""The figures of the silent-fault tests (timeline.py), on small hand-made timelines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mega.jobs.timeline import Records, Stall, longest_gap, longest_stall, next_start


@pytest.mark.parametrize(
    ("acked", "starts", "until", "stall"),
    [
        # a steady start every second while work waits: 1 s
        ({"a": 0, "b": 0, "c": 0}, [(1, "a"), (2, "b"), (3, "c")], 3, Stall(1, 1, 2)),
        # nothing waits between b's start and c's PubAck: only c's wait counts
        ({"a": 0, "b": 0, "c": 8}, [(1, "a"), (2, "b"), (10, "c")], 10, Stall(2, 8, 10)),
        # a job never started waits until the end of the observation
        ({"a": 0, "b": 0}, [(1, "a")], 20, Stall(19, 1, 20)),
        # a job waiting behind a redelivered one: the repeat start ends the stall
        ({"a": 0, "b": 0}, [(1, "a"), (5, "a"), (12, "b")], 12, Stall(7, 5, 12)),
        # nothing left to wait for after the last start: no stall to the end
        ({"a": 0}, [(1, "a")], 60, Stall(0, 1, 1)),
        # no start at all: from the first PubAck
        ({"a": 2, "b": 3}, [], 10, Stall(8, 2, 10)),
    ],
)
def test_longest_stall_is_work_waiting_with_no_start(
    acked: dict[str, float], starts: list[tuple[float, str]], until: float, stall: Stall
) -> None:
    assert longest_stall(acked, starts, until) == stall


def test_longest_stall_since_an_instant_leaves_out_what_came_before() -> None:
    acked = {"a": 0, "b": 0, "c": 0, "d": 0}
    starts = [(1.0, "a"), (9.0, "b"), (10.0, "c"), (13.0, "d")]
    assert longest_stall(acked, starts, 13) == Stall(8, 1, 9)
    assert longest_stall(acked, starts, 13, since=9.5) == Stall(3, 10, 13)
    # no start at all: from `since`, or the first PubAck when later
    assert longest_stall({"a": 2, "b": 3}, [], 10, since=0) == Stall(8, 2, 10)


@pytest.mark.parametrize(("after", "seconds"), [(0.0, 1.0), (1.0, 2.0), (2.5, 0.5), (3.0, None)])
def test_next_start_is_the_first_start_past_an_instant(after: float, seconds: float | None) -> None:
    assert next_start([1.0, 3.0, 3.0], after) == seconds


def test_longest_gap_counts_from_and_to_the_window_edges() -> None:
    assert longest_gap([2.0, 3.0, 9.0], 0.0, 10.0) == 6.0
    assert longest_gap([], 0.0, 10.0) == 10.0
    assert longest_gap([1.0, 20.0], 0.0, 10.0) == 9.0


def test_records_reads_complete_lines_and_later_what_was_added(tmp_path: Path) -> None:
    log = tmp_path / "123.log"
    log.write_text("1.5 start a\n2.5 done a\n3.0 sta")
    records = Records(tmp_path).read()
    assert records.starts == [(1.5, "a")] and records.done == {"a": 1}
    with log.open("a") as file:
        file.write("rt b\n")
    assert records.read().starts == [(1.5, "a"), (3.0, "b")]
    assert records.started() == {"a", "b"} and records.start_times() == [1.5, 3.0]
