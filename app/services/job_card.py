"""What the jobs page says of one job, read off its status record: one line when it was
enqueued, one per attempt (the earlier ones from the record's `history`), and one when it
ended in the DLQ or was cancelled. Pure: a `JobStatus` in, lines out.

Attempts are the framework's count: attempt N is the Nth run; a delivery after the last
attempt that is not run (its worker died) is no attempt of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from app.services.instances import short_instance
from mega import AttemptRecord, JobStatus

# The error type the queue gives a job whose last attempt never reported back.
CRASHED = "WorkerCrashed"


@dataclass(frozen=True)
class Line:
    """One line of a card: `kind` (its colour: enqueued, running, retry, done, fail, lost,
    dlq, cancelled), when (epoch ms, None when the record does not say) and what happened."""

    kind: str
    at: int | None
    detail: str

    @property
    def time(self) -> str:
        return clock(self.at) if self.at is not None else ""


def clock(at_ms: int) -> str:
    """HH:MM:SS.mmm (UTC), as every time on the page."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def card_lines(status: JobStatus) -> list[Line]:
    """The job's lines, oldest first: a job the DLQ gave back (from this page, the console or
    `mega dlq requeue`) keeps its runs before, then says it was requeued, its attempts counted
    from 1 again."""
    if status.requeues:
        lines = [earlier_attempt(attempt) for attempt in status.before_requeue]
        times = "" if status.requeues == 1 else f" again ({status.requeues} times in all)"
        lines.append(
            Line(
                "enqueued",
                status.enqueued_at,
                f"requeued from the DLQ{times}: attempts count from 1 again",
            )
        )
    else:
        lines = [enqueued(status)]
    lines += [earlier_attempt(attempt) for attempt in status.history]
    if status.attempts and status.state not in ("queued", "delayed"):
        lines.append(latest_attempt(status))
    if status.state == "dlq":
        ran = plural(status.attempts, "attempt")
        lines.append(Line("dlq", status.finished_at, f"moved to the dead-letter queue after {ran}"))
    elif status.state == "cancelled":
        when = "before it ran" if not status.attempts else f"during attempt {status.attempts}"
        lines.append(Line("cancelled", status.finished_at, f"cancelled {when}: never retried"))
    return lines


def enqueued(status: JobStatus) -> Line:
    detail = "enqueued"
    if status.due_at is not None and status.enqueued_at is not None and status.attempts == 0:
        held = status.due_at - status.enqueued_at
        detail += f", held {held} ms: due at {clock(status.due_at)} (no slot taken meanwhile)"
    return Line("enqueued", status.enqueued_at, detail)


def earlier_attempt(attempt: AttemptRecord) -> Line:
    on = f"attempt {attempt.attempt}{worker_part(attempt.worker)}"
    crashed = attempt.error is not None and attempt.error.type == CRASHED
    if attempt.state == "lost" or crashed:
        end = "; to the DLQ" if attempt.state == "dlq" else ""
        return Line("lost", attempt.started_at, f"{on} never reported back: its worker died{end}")
    took = took_part(attempt.started_at, attempt.finished_at)
    if attempt.state == "dlq":  # the last run before a requeue
        return Line(
            "dlq", attempt.started_at, f"{on} failed{took}: {error_text(attempt)}; to the DLQ"
        )
    if attempt.state == "done":
        return Line("done", attempt.started_at, f"{on} succeeded{took}")
    return Line("retry", attempt.started_at, f"{on} failed{took}: {error_text(attempt)}")


def latest_attempt(status: JobStatus) -> Line:
    on = f"attempt {status.attempts}{worker_part(status.worker)}"
    took = took_part(status.started_at, status.finished_at)
    at = status.started_at
    if status.state == "running":
        return Line("running", at, f"{on} running")
    if status.state == "done":
        return Line("done", at, f"{on} succeeded{took}")
    if status.state == "retrying":
        due = f"; retry due at {clock(status.due_at)}" if status.due_at else ""
        return Line("retry", at, f"{on} failed{took}: {error_text(status)}{due}")
    if status.state == "cancelled":
        return Line("cancelled", at, f"{on} cancelled{took}")
    if status.error is not None and status.error.type == CRASHED:
        # Found by the delivery after the last attempt, on whichever worker got it.
        return Line("lost", at, f"{on} never reported back: its worker died")
    return Line("fail", at, f"{on} failed{took}: {error_text(status)}; no tries left")


def worker_part(worker: str | None) -> str:
    return f" on worker {short_instance(worker)}" if worker else ""


def took_part(started_at: int | None, finished_at: int | None) -> str:
    if started_at is None or finished_at is None:
        return ""
    return f" in {max(0, finished_at - started_at)} ms"


def error_text(record: JobStatus | AttemptRecord) -> str:
    return f"{record.error.type}: {record.error.message}" if record.error else "no error kept"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
