"""The jobs page's card, a pure function of a job's status record: one line when it was
enqueued, one per attempt with its worker, error and times, one when it ended."""

from __future__ import annotations

from typing import Any

import pytest

from app.services.job_card import card_lines, clock
from mega import AttemptRecord, JobStatus
from mega.lanes.records import ErrorInfo

T = 1_780_000_000_000  # an instant in epoch ms
W1, W2 = "worker@box:4121:a1b2c3", "worker@box:4122:d4e5f6"
FAILED = {"type": "SimulatedSendError", "message": "mailbox rejected the message"}


def status(**fields: Any) -> JobStatus:
    return JobStatus(id="j1", job="EmailJob", enqueued_at=T, **fields)


@pytest.mark.parametrize(
    ("record", "lines"),
    [
        (status(state="queued"), [("enqueued", T, "enqueued")]),
        (
            status(state="delayed", due_at=T + 1500),
            [
                (
                    "enqueued",
                    T,
                    f"enqueued, held 1500 ms: due at {clock(T + 1500)} (no slot taken meanwhile)",
                )
            ],
        ),
        (
            status(state="running", attempts=1, started_at=T + 4, worker=W1),
            [
                ("enqueued", T, "enqueued"),
                ("running", T + 4, "attempt 1 on worker a1b2c3 (pid 4121) running"),
            ],
        ),
        (
            status(
                state="done",
                attempts=2,
                started_at=T + 600,
                finished_at=T + 612,
                worker=W2,
                history=(
                    AttemptRecord(
                        attempt=1,
                        state="retrying",
                        worker=W1,
                        started_at=T + 3,
                        error=ErrorInfo(**FAILED),
                    ),
                ),
            ),
            [
                ("enqueued", T, "enqueued"),
                (
                    "retry",
                    T + 3,
                    "attempt 1 on worker a1b2c3 (pid 4121) failed: SimulatedSendError: "
                    "mailbox rejected the message",
                ),
                ("done", T + 600, "attempt 2 on worker d4e5f6 (pid 4122) succeeded in 12 ms"),
            ],
        ),
        (
            status(
                state="retrying",
                attempts=1,
                started_at=T + 3,
                worker=W1,
                error=FAILED,
                due_at=T + 400,
            ),
            [
                ("enqueued", T, "enqueued"),
                (
                    "retry",
                    T + 3,
                    "attempt 1 on worker a1b2c3 (pid 4121) failed: SimulatedSendError: "
                    f"mailbox rejected the message; retry due at {clock(T + 400)}",
                ),
            ],
        ),
        (
            status(
                state="dlq",
                attempts=1,
                started_at=T + 3,
                finished_at=T + 5,
                worker=W1,
                error={"type": "Permanent", "message": "no mailbox"},
                requeues=1,
                before_requeue=(
                    AttemptRecord(
                        attempt=1,
                        state="dlq",
                        worker=W2,
                        started_at=T - 900,
                        finished_at=T - 898,
                        error=ErrorInfo(**FAILED),
                    ),
                ),
            ),
            [
                (
                    "dlq",
                    T - 900,
                    "attempt 1 on worker d4e5f6 (pid 4122) failed in 2 ms: "
                    "SimulatedSendError: mailbox rejected the message; to the DLQ",
                ),
                ("enqueued", T, "requeued from the DLQ: attempts count from 1 again"),
                (
                    "fail",
                    T + 3,
                    "attempt 1 on worker a1b2c3 (pid 4121) failed in 2 ms: Permanent: "
                    "no mailbox; no tries left",
                ),
                ("dlq", T + 5, "moved to the dead-letter queue after 1 attempt"),
            ],
        ),
        (
            status(
                state="dlq",
                attempts=2,
                finished_at=T + 9000,
                worker=W2,
                error={"type": "WorkerCrashed", "message": "attempt 2 of 2 never reported"},
                history=(AttemptRecord(attempt=1, state="lost", worker=W1, started_at=T + 3),),
            ),
            [
                ("enqueued", T, "enqueued"),
                (
                    "lost",
                    T + 3,
                    "attempt 1 on worker a1b2c3 (pid 4121) never reported back: its worker died",
                ),
                (
                    "lost",
                    None,
                    "attempt 2 on worker d4e5f6 (pid 4122) never reported back: its worker died",
                ),
                ("dlq", T + 9000, "moved to the dead-letter queue after 2 attempts"),
            ],
        ),
        (
            status(
                state="cancelled", attempts=1, started_at=T + 3, finished_at=T + 2003, worker=W1
            ),
            [
                ("enqueued", T, "enqueued"),
                ("cancelled", T + 3, "attempt 1 on worker a1b2c3 (pid 4121) cancelled in 2000 ms"),
                ("cancelled", T + 2003, "cancelled during attempt 1: never retried"),
            ],
        ),
        (
            status(state="cancelled", finished_at=T + 50),
            [
                ("enqueued", T, "enqueued"),
                ("cancelled", T + 50, "cancelled before it ran: never retried"),
            ],
        ),
    ],
)
def test_a_record_reads_as_lines(
    record: JobStatus, lines: list[tuple[str, int | None, str]]
) -> None:
    assert [(line.kind, line.at, line.detail) for line in card_lines(record)] == lines


def test_a_line_shows_its_time_in_utc_to_the_millisecond() -> None:
    [line] = card_lines(status(state="queued"))
    assert line.time == clock(T) and len(line.time) == len("12:00:00.000")
