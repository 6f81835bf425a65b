"""The EmailJob demo's state in Redis: one record and one event timeline per job id.

    demo:jobs:index          ids, newest first (bounded)
    demo:jobs:job:<id>       hash: id, to, mode, status, attempts, created_at, `progress`
                             (JSON {fraction, note}: the running attempt's latest report),
                             `running` (JSON {attempt, worker}: an attempt that started and
                             has not reported back yet) and `due_at`/`due_after` (when the
                             next attempt is due, epoch ms, and after what: enqueue, delay,
                             retry or requeue; taken by the start it was due for)
    demo:jobs:events:<id>    the timeline, JSON events oldest first (bounded)
    demo:jobs:attempts:<id>  attempts counted by the job itself (EmailJob.run)
    demo:jobs:latency        recent enqueue-to-start latencies in ms (bounded)

Everything is bounded or expires, so a long-running demo never grows Redis without limit.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from redis.asyncio import Redis

INDEX_KEY = "demo:jobs:index"
LATENCY_KEY = "demo:jobs:latency"
# Jobs the page lists, events per job, latency samples kept, and how long a job's data lives.
MAX_JOBS = 30
# Jobs per page of /demo/jobs (older ones are a link away: ?before=<id>).
PAGE_JOBS = 10
MAX_EVENTS = 40
MAX_LATENCIES = 200
TTL_S = 24 * 3600


def job_key(job_id: str) -> str:
    return f"demo:jobs:job:{job_id}"


def events_key(job_id: str) -> str:
    return f"demo:jobs:events:{job_id}"


def attempts_key(job_id: str) -> str:
    return f"demo:jobs:attempts:{job_id}"


def now_ms() -> int:
    return int(time.time() * 1000)


# What a due time counts from, for the start line that takes it.
DueAfter = Literal["enqueue", "delay", "retry", "requeue"]
# Events after which the attempt that was running has reported back.
REPORTS = frozenset({"retry", "done", "fail", "redelivered", "requeued"})


@dataclass(frozen=True)
class Running:
    """An attempt that started and has not reported back (yet): the worker that runs it."""

    attempt: int
    worker: str


@dataclass(frozen=True)
class Due:
    """When the next attempt is due (epoch ms) and what set that time."""

    at: int
    after: DueAfter


@dataclass(frozen=True)
class JobState:
    """What the timeline needs to word the next line of a job."""

    created_at: int
    running: Running | None
    due: Due | None


async def record_enqueued(
    redis: Redis, job_id: str, to: str, mode: str, *, delay_ms: int = 0
) -> None:
    created_at = now_ms()
    record: dict[Any, Any] = {
        "id": job_id, "to": to, "mode": mode, "status": "queued", "attempts": 0,
        "created_at": created_at, "due_at": created_at + delay_ms,
        "due_after": "delay" if delay_ms else "enqueue",
    }  # fmt: skip
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(job_key(job_id), mapping=record)
        pipe.expire(job_key(job_id), TTL_S)
        pipe.lpush(INDEX_KEY, job_id)
        pipe.ltrim(INDEX_KEY, 0, MAX_JOBS - 1)
        await pipe.execute()
    held = ""
    if delay_ms:
        due = clock(created_at + delay_ms)
        held = f", held {delay_ms} ms: due at {due} (no slot taken meanwhile)"
    await record_event(redis, job_id, "enqueued", f"to {to}, mode {mode}{held}")


async def forget(redis: Redis, job_id: str) -> None:
    """Undo record_enqueued (the enqueue itself failed)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(job_key(job_id), events_key(job_id))
        pipe.lrem(INDEX_KEY, 1, job_id)
        await pipe.execute()


async def job_state(redis: Redis, job_id: str) -> JobState | None:
    """The job's running attempt and next due time (None: not a job of the page)."""
    created, running, due_at, due_after = await redis.hmget(  # type: ignore[misc]
        job_key(job_id), ["created_at", "running", "due_at", "due_after"]
    )
    if created is None:
        return None
    return JobState(
        created_at=int(created),
        running=Running(**json.loads(running)) if running else None,
        due=Due(int(due_at), cast(DueAfter, due_after)) if due_at and due_after else None,
    )


async def record_event(
    redis: Redis,
    job_id: str,
    kind: str,
    detail: str,
    *,
    status: str | None = None,
    attempt: int | None = None,
    worker: str | None = None,
    due: Due | None = None,
    at: int | None = None,
) -> None:
    """Append to the timeline at `at` (epoch ms, default now); `status`/`attempt` also update
    the job's record (if it exists: a job enqueued outside the page has no record and is
    ignored). A new attempt number (an attempt starts, or a requeue resets them) clears the last
    attempt's progress and takes its due time; a start names its `worker`, kept as `running`
    until an event of REPORTS. `due` is when the next attempt is due (a retry, a requeue)."""
    if not await redis.exists(job_key(job_id)):
        return
    event = {"at": at or now_ms(), "kind": kind, "detail": detail, "attempt": attempt}
    key = job_key(job_id)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.rpush(events_key(job_id), json.dumps(event))
        pipe.ltrim(events_key(job_id), -MAX_EVENTS, -1)
        pipe.expire(events_key(job_id), TTL_S)
        if status is not None:
            pipe.hset(key, "status", status)
        if kind in REPORTS:
            pipe.hdel(key, "running")
        if attempt is not None:
            pipe.hset(key, "attempts", attempt)
            pipe.hdel(key, "progress", "due_at", "due_after")
        if worker is not None and attempt is not None:
            pipe.hset(key, "running", json.dumps({"attempt": attempt, "worker": worker}))
        if due is not None:
            pipe.hset(key, mapping={"due_at": due.at, "due_after": due.after})
        await pipe.execute()


async def record_progress(redis: Redis, job_id: str, fraction: float, note: str | None) -> None:
    """Keep the running attempt's latest progress report (the page draws it as a bar); not a
    timeline event, so a job reporting often cannot push its history out."""
    if not await redis.exists(job_key(job_id)):
        return
    report = json.dumps({"fraction": fraction, "note": note})
    await redis.hset(job_key(job_id), "progress", report)


async def record_latency(redis: Redis, latency_ms: float) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.lpush(LATENCY_KEY, latency_ms)
        pipe.ltrim(LATENCY_KEY, 0, MAX_LATENCIES - 1)
        await pipe.execute()


async def latency_p50_ms(redis: Redis) -> float | None:
    samples = [float(value) for value in await redis.lrange(LATENCY_KEY, 0, -1)]
    return round(statistics.median(samples), 1) if samples else None


def clock(at_ms: int) -> str:
    """HH:MM:SS.mmm (UTC), for the timeline."""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


@dataclass(frozen=True)
class JobPage:
    """Jobs newest first, and the id to ask `before` for the next (older) page, if any."""

    jobs: list[dict[str, Any]]
    older: str | None


async def list_jobs(redis: Redis, limit: int = MAX_JOBS, *, before: str | None = None) -> JobPage:
    """Up to `limit` jobs newest first, those older than job `before` when it is given (a
    cursor, not an offset: jobs enqueued meanwhile do not shift the page; an id no longer kept
    gives an empty page). Each is {id, to, mode, status, attempts, created_at, progress,
    events}, where progress is the current attempt's latest {fraction, note}, or None."""
    kept: list[str] = await redis.lrange(INDEX_KEY, 0, MAX_JOBS - 1)  # type: ignore[assignment]
    if before is not None:
        kept = kept[kept.index(before) + 1 :] if before in kept else []
    ids, rest = kept[:limit], kept[limit:]
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(job_key(job_id))
            pipe.lrange(events_key(job_id), 0, -1)
        replies = await pipe.execute()
    jobs = []
    for record, events in zip(replies[::2], replies[1::2], strict=True):
        if not record:
            continue  # expired
        jobs.append(
            {
                "id": record["id"],
                "to": record["to"],
                "mode": record["mode"],
                "status": record["status"],
                "attempts": int(record["attempts"]),
                "created_at": int(record["created_at"]),
                "progress": json.loads(record["progress"]) if "progress" in record else None,
                "events": [
                    {**event, "time": clock(event["at"])}
                    for event in sorted((json.loads(e) for e in events), key=lambda e: e["at"])
                ],
            }
        )
    return JobPage(jobs, ids[-1] if rest and ids else None)
