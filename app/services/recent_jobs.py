"""The jobs page's own data in Redis: which jobs it lists, and what their status records do not
say. Where a job is, its attempts, workers, errors, times and result are the framework's status
record (`JobQueue.status`); this is application data beside it.

    demo:jobs:index          ids, newest first (the newest MAX_JOBS)
    demo:jobs:job:<id>       hash: `to` and `mode` (the payload's, for the card), `requeues`
                             (how many times the DLQ gave the job back) and `progress` (JSON
                             {attempt, fraction, note}: the latest report of a running attempt,
                             from the worker's `progress` signal)

Everything is bounded or expires, so a long-running demo never grows Redis without limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mega import RedisClient


INDEX_KEY = "demo:jobs:index"
# Jobs the page keeps, and how many it shows at a time (older ones are a link away).
MAX_JOBS = 30
PAGE_JOBS = 10
# How long a job's entry lives: as long as its status record (EmailJob's keep_status_s).
TTL_S = 24 * 3600


def job_key(job_id: str) -> str:
    return f"demo:jobs:job:{job_id}"


@dataclass(frozen=True)
class Progress:
    """A running attempt's latest report."""

    attempt: int
    fraction: float
    note: str | None


@dataclass(frozen=True)
class Entry:
    """What the page keeps of one job."""

    id: str
    to: str
    mode: str
    requeues: int
    progress: Progress | None


@dataclass(frozen=True)
class RecentPage:
    """Entries newest first, and the id to ask `before` for the next (older) page, if any."""

    entries: list[Entry]
    older: str | None


async def remember(redis: RedisClient, job_id: str, to: str, mode: str) -> None:
    """List a job the page (or a listener) is about to enqueue."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(job_key(job_id), mapping={"to": to, "mode": mode, "requeues": 0})
        pipe.expire(job_key(job_id), TTL_S)
        pipe.lpush(INDEX_KEY, job_id)
        pipe.ltrim(INDEX_KEY, 0, MAX_JOBS - 1)
        await pipe.execute()


async def forget(redis: RedisClient, job_id: str) -> None:
    """Undo `remember` (the enqueue itself failed)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(job_key(job_id))
        pipe.lrem(INDEX_KEY, 1, job_id)
        await pipe.execute()


async def note_requeue(redis: RedisClient, job_id: str) -> None:
    """The DLQ gave the job back: its status record starts again at attempt 1."""
    if await redis.exists(job_key(job_id)):
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(job_key(job_id), "requeues", 1)
            pipe.hdel(job_key(job_id), "progress")
            await pipe.execute()


async def record_progress(
    redis: RedisClient, job_id: str, attempt: int, fraction: float, note: str | None
) -> None:
    """Keep a running attempt's latest report (the page draws it as a bar) for a listed job."""
    if await redis.exists(job_key(job_id)):
        report = {"attempt": attempt, "fraction": fraction, "note": note}
        await redis.hset(job_key(job_id), "progress", json.dumps(report))


async def recent(
    redis: RedisClient, limit: int = MAX_JOBS, *, before: str | None = None
) -> RecentPage:
    """Up to `limit` entries newest first, those older than job `before` when it is given (a
    cursor, not an offset: jobs enqueued meanwhile do not shift the page; an id no longer kept
    gives an empty page)."""
    kept: list[str] = await redis.lrange(INDEX_KEY, 0, MAX_JOBS - 1)  # type: ignore[assignment]
    if before is not None:
        kept = kept[kept.index(before) + 1 :] if before in kept else []
    ids, rest = kept[:limit], kept[limit:]
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(job_key(job_id))
        records: list[dict[str, Any]] = await pipe.execute()
    entries = [
        Entry(
            id=job_id,
            to=record["to"],
            mode=record["mode"],
            requeues=int(record.get("requeues", 0)),
            progress=Progress(**json.loads(record["progress"])) if "progress" in record else None,
        )
        for job_id, record in zip(ids, records, strict=True)
        if record  # expired
    ]
    return RecentPage(entries, ids[-1] if rest and ids else None)
