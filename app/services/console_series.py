"""The console's charts: the last 10 minutes of the job queue and the schedule, in 10 s steps.

The web process draws them, but the numbers are counted elsewhere (the worker runs the jobs,
the scheduler ticks), so every series comes from state in Redis that all processes share:

    demo:console:done:<step>    EmailJobs finished in that step (INCR by the worker's hook)
    demo:console:start:<step>   enqueue-to-start latencies (ms) of first attempts started in
                                that step (RPUSH by the worker's hook, at most MAX_STARTS kept)
    demo:console:dlq:<step>     the DLQ size, sampled by the web process when it reads the
                                console and by the worker when it dead-letters an EmailJob
                                (the last sample in a step wins)
    <lock prefix>:audit         the scheduler's own tick audit: each tick's lateness (read as is)

`<step>` is the Unix time in seconds divided by STEP_S. Every key expires one step after it
leaves the window, so nothing needs trimming and Redis never grows.

Why buckets rather than one timestamped record per job: the reader's cost stays fixed
(one pipeline of 3 x 60 reads) whatever the job rate, and the worker's cost is one pipeline
per finished or started job. Why not the jobs' status records: they answer "where is job X",
and a chart would have to read every job of ten minutes to count them. Why the worker writes them
rather than the web process scraping the worker's Prometheus counters: the web process does not
know where the workers are, and a restarted worker's counters start again from zero.

The DLQ size is a level, not an event, so someone has to look at it: the worker samples it when
a job lands there (rare, so off the hot path), and the web process each time the console is read
(the page polls every 2 s), which also catches requeues. Steps with neither have no DLQ point;
the chart holds the last value across them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mega import RedisClient


KEY_PREFIX = "demo:console"
# One point per STEP_S seconds over WINDOW_S: 60 points.
STEP_S = 10
WINDOW_S = 600
STEPS = WINDOW_S // STEP_S
# Latency samples kept per step: enough for a p99 at any demo rate, bounded at any other.
MAX_STARTS = 1000
# A key lives while it is in the window, plus one step of slack for clocks a little apart.
TTL_S = WINDOW_S + STEP_S

Point = list[float]  # [t_ms, value]: t is the start of the step (ms since the epoch)


def step_of(at_s: float) -> int:
    return int(at_s // STEP_S)


def done_key(step: int) -> str:
    return f"{KEY_PREFIX}:done:{step}"


def start_key(step: int) -> str:
    return f"{KEY_PREFIX}:start:{step}"


def dlq_key(step: int) -> str:
    return f"{KEY_PREFIX}:dlq:{step}"


# -- writers (the worker's hook, the web process) --------------------------------------------


async def record_done(redis: RedisClient, at_s: float | None = None) -> None:
    """A job finished now: for each `done` signal."""
    at_s = time.time() if at_s is None else at_s
    key = done_key(step_of(at_s))
    async with redis.pipeline(transaction=False) as pipe:
        pipe.incr(key)
        pipe.expire(key, TTL_S)
        await pipe.execute()


async def record_start(redis: RedisClient, latency_ms: float, at_s: float | None = None) -> None:
    """A first attempt started `latency_ms` after its enqueue (or due time)."""
    at_s = time.time() if at_s is None else at_s
    key = start_key(step_of(at_s))
    async with redis.pipeline(transaction=False) as pipe:
        pipe.rpush(key, latency_ms)
        pipe.ltrim(key, 0, MAX_STARTS - 1)
        pipe.expire(key, TTL_S)
        await pipe.execute()


async def record_dlq_size(redis: RedisClient, size: int, at_s: float | None = None) -> None:
    """The DLQ holds `size` records now (the web process samples it)."""
    await redis.set(dlq_key(step_of(time.time() if at_s is None else at_s)), size, ex=TTL_S)


# -- the readers -------------------------------------------------------------------------------


async def read_series(
    redis: RedisClient, ticks: Iterable[dict[str, Any]], now_s: float | None = None
) -> dict[str, Any]:
    """Every series over the window ending now, oldest point first. `ticks` are the schedule's
    recent ticks as `Scheduler.recent_ticks` gives them (ISO instants, lateness in ms)."""
    now_s = time.time() if now_s is None else now_s
    last = step_of(now_s)
    steps = range(last - STEPS + 1, last + 1)
    async with redis.pipeline(transaction=False) as pipe:
        for step in steps:
            pipe.get(done_key(step))
            pipe.lrange(start_key(step), 0, -1)
            pipe.get(dlq_key(step))
        replies = await pipe.execute()
    done = [int(count or 0) for count in replies[0::3]]
    starts = [[float(value) for value in values] for values in replies[1::3]]
    dlq = [None if size is None else int(size) for size in replies[2::3]]
    return build_series(list(steps), now_s, done, starts, dlq, ticks)


def build_series(
    steps: Sequence[int],
    now_s: float,
    done: Sequence[int],
    starts: Sequence[Sequence[float]],
    dlq: Sequence[int | None],
    ticks: Iterable[dict[str, Any]],
) -> dict[str, Any]:
    """The pure half of `read_series`: per-step counts and samples in, chart points out.

    jobs_per_s has a point for every step (0 when nothing finished; the current step's rate is
    over the seconds it has run so far); the latency percentiles only for steps in which a job
    started; dlq only for sampled steps; tick_lateness_ms one point per scheduled tick.
    `totals` counts what the window holds (jobs finished, first attempts started, ticks)."""
    start_ms = steps[0] * STEP_S * 1000
    jobs_per_s: list[Point] = []
    p50: list[Point] = []
    p99: list[Point] = []
    dlq_points: list[Point] = []
    for step, finished, samples, size in zip(steps, done, starts, dlq, strict=True):
        t_ms = step * STEP_S * 1000
        elapsed_s = min(STEP_S, max(1.0, now_s - step * STEP_S))
        jobs_per_s.append([t_ms, round(finished / elapsed_s, 2)])
        if samples:
            p50.append([t_ms, round(percentile(samples, 50), 1)])
            p99.append([t_ms, round(percentile(samples, 99), 1)])
        if size is not None:
            dlq_points.append([t_ms, size])
    lateness: list[Point] = []
    for tick in ticks:
        if tick.get("source") != "schedule" or tick.get("lateness_ms") is None:
            continue
        instant_ms = round(datetime.fromisoformat(tick["instant"]).timestamp() * 1000)
        if start_ms <= instant_ms <= now_s * 1000:
            lateness.append([instant_ms, tick["lateness_ms"]])
    lateness.sort()
    return {
        "window": {
            "start_ms": start_ms,
            "end_ms": round(now_s * 1000),
            "step_s": STEP_S,
            "seconds": WINDOW_S,
        },
        "jobs_per_s": jobs_per_s,
        "start_p50_ms": p50,
        "start_p99_ms": p99,
        "dlq": dlq_points,
        "tick_lateness_ms": lateness,
        "totals": {
            "jobs_done": sum(done),
            "starts": sum(len(samples) for samples in starts),
            "ticks": len(lateness),
        },
    }


async def start_latency_p50_ms(redis: RedisClient, now_s: float | None = None) -> float | None:
    """The median enqueue-to-start latency (ms) of the first attempts started in the window,
    or None when none started."""
    last = step_of(time.time() if now_s is None else now_s)
    async with redis.pipeline(transaction=False) as pipe:
        for step in range(last - STEPS + 1, last + 1):
            pipe.lrange(start_key(step), 0, -1)
        replies = await pipe.execute()
    samples = [float(value) for values in replies for value in values]
    return round(percentile(samples, 50), 1) if samples else None


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of a non-empty sample: always one of
    the samples, so p99 of a few jobs is their slowest, not an interpolation."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
