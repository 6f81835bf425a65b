"""The timeline's start line, a pure function of the job's state: how long after its due time
an attempt started, and after what that time was set."""

from __future__ import annotations

import pytest

from app.jobs.timeline import redelivered_detail, start_detail
from app.services.job_timeline import Due, JobState, Running

ENQUEUED_AT = 1_000_000


@pytest.mark.parametrize(
    "due,at,line",
    [
        (Due(ENQUEUED_AT, "enqueue"), ENQUEUED_AT + 3, "3 ms after enqueue"),
        (Due(ENQUEUED_AT + 10_000, "delay"), ENQUEUED_AT + 10_002,
         "2 ms after it was due, 10002 ms after enqueue"),
        (Due(ENQUEUED_AT + 700, "retry"), ENQUEUED_AT + 935, "235 ms after it was due"),
        (Due(ENQUEUED_AT + 60_000, "requeue"), ENQUEUED_AT + 60_004, "4 ms after the requeue"),
        (Due(ENQUEUED_AT + 500, "retry"), ENQUEUED_AT + 499, "0 ms after it was due"),  # clocks
    ],
)  # fmt: skip
def test_a_start_counts_from_its_due_time(due: Due, at: int, line: str) -> None:
    state = JobState(created_at=ENQUEUED_AT, running=None, due=due)
    assert start_detail(2, "a1b2c3", state, at) == f"attempt 2 started on worker a1b2c3, {line}"


def test_a_redelivery_was_due_at_no_set_time_and_names_the_dead_worker() -> None:
    state = JobState(created_at=ENQUEUED_AT, running=Running(1, "a1b2c3"), due=None)
    assert start_detail(2, "d4e5f6", state, ENQUEUED_AT + 5_000) == (
        "attempt 2 started on worker d4e5f6"
    )
    assert redelivered_detail("a1b2c3") == "no ack within 5 s: worker a1b2c3 died, redelivered"
