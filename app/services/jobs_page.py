"""What /demo/jobs and GET /api/demo/jobs show: the page's recent EmailJobs, each read from its
status record (state, attempts, workers, errors, times, result) beside what the page keeps of
it (recipient, mode, progress), and the DLQ."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from app.jobs.email import EmailJob
from app.services import recent_jobs
from app.services.job_card import Line, card_lines
from app.services.recent_jobs import Entry
from mega import JobQueue, JobStatus
from mega.errors import DependencyUnavailable, JobError

if TYPE_CHECKING:
    from mega import RedisClient

# How many dead letters the page lists (the count covers all of them).
DLQ_LISTED = 20
# The states a cancel still changes: a job that has not ended.
CANCELLABLE = frozenset({"queued", "delayed", "running", "retrying"})
# A listed job whose record is gone (expired) or cannot be read now.
UNKNOWN = "unknown"


async def job_view(queue: JobQueue, job_id: str) -> dict[str, Any] | None:
    """The job's status record as JSON with `result`, what its run returned when it is kept
    (None otherwise), or None for a job with no record."""
    status = await queue.status(EmailJob, job_id)
    if status is None:
        return None
    return {**status.model_dump(mode="json"), "result": await result_of(queue, status)}


async def result_of(queue: JobQueue, status: JobStatus) -> Any:
    if not status.result_kept:
        return None
    with contextlib.suppress(JobError):  # expired since: the record says it was kept
        return await queue.result(EmailJob, status.id)
    return None


async def listed_status(queue: JobQueue, job_id: str) -> tuple[JobStatus | None, Any]:
    """A listed job's record and result. A record the bus cannot give (its store lost in a
    restart of the broker, say) makes that one job unknown rather than the whole page fail."""
    try:
        status = await queue.status(EmailJob, job_id)
        return status, None if status is None else await result_of(queue, status)
    except DependencyUnavailable:
        return None, None


def card(entry: Entry, status: JobStatus | None, result: Any) -> dict[str, Any]:
    """One job as the page draws it: `lines` oldest first, `progress` only while the attempt
    that reported it runs."""
    base = {"id": entry.id, "to": entry.to, "mode": entry.mode}
    if status is None:
        line = Line(UNKNOWN, None, "no status record: it expired, or cannot be read now")
        return {
            **base,
            "state": UNKNOWN,
            "attempts": 0,
            "cancellable": False,
            "result": None,
            "progress": None,
            "lines": [as_json(line)],
        }
    progress = entry.progress
    if status.state != "running" or progress is None or progress.attempt != status.attempts:
        progress = None
    return {
        **base,
        "state": status.state,
        "attempts": status.attempts,
        "cancellable": status.state in CANCELLABLE,
        "result": result,
        "progress": {"fraction": progress.fraction, "note": progress.note} if progress else None,
        "lines": [as_json(line) for line in card_lines(status)],
    }


def as_json(line: Line) -> dict[str, Any]:
    return {**asdict(line), "time": line.time}


async def jobs_state(
    queue: JobQueue,
    redis: RedisClient,
    *,
    limit: int = recent_jobs.MAX_JOBS,
    before: str | None = None,
) -> dict[str, Any]:
    """`jobs` newest first (`limit` of them, older than job `before` if given), `older` (the
    `before` of the next page, or None), and the DLQ."""
    page = await recent_jobs.recent(redis, limit, before=before)
    read = await asyncio.gather(*(listed_status(queue, entry.id) for entry in page.entries))
    # Read after the cards: a card that says `dlq` has its dead letter in the list below.
    dlq = queue.dlq
    records = await dlq.list(EmailJob, limit=DLQ_LISTED)
    return {
        "jobs": [
            card(entry, status, result)
            for entry, (status, result) in zip(page.entries, read, strict=True)
        ],
        "older": page.older,
        "dlq": {
            "count": await dlq.count(EmailJob),
            "items": [
                {
                    "id": r["id"],
                    "to": (r.get("payload") or {}).get("to"),
                    "error": f"{r['error']['type']}: {r['error']['message']}",
                    "attempts": r["attempts"],
                    "failed_at": r["failed_at"],
                }
                for r in records
            ],
        },
    }
