"""Jobs for the fault tests of tests/mega/jobs (test_jobs_faults.py, test_cluster.py,
test_silent_faults.py), run by real `mega worker` processes.

The subjects and Redis keys carry a prefix from the environment (FAULT_PREFIX), so that every
test has its own streams and keys. What each run does is recorded in the config's `main` cache:

    <prefix>:started:<pid>   hash, job id -> 1     the process <pid> began running the job
    <prefix>:done            hash, job id -> n     the job's effect: n runs completed
    <prefix>:runs            hash, job id -> n     CrashJob runs (each one ends its process)
    <prefix>:cancelled:<pid> hash, job id -> 1     LongJob runs a cancel cut short in <pid>

Which jobs a process had acked is the broker's to say: they are gone from the work-queue stream.

TimedJob records to files instead (tests/mega/jobs/timeline.py reads them), for workers that
reach no Redis: a line `<epoch s> start|done <job id>` in <FAULT_RECORDS>/<pid>.log.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from pathlib import Path
from typing import Any, TextIO

from mega import Context, Job
from mega.lanes.declaration import DEFAULT_ACK_WAIT_S

PREFIX = os.environ.get("FAULT_PREFIX", "faults")
# Redelivery of an unacked job after a worker dies comes this quickly (running jobs renew it).
ACK_WAIT_S = 1.0
# Retries in milliseconds: the tests wait on behaviour, not on backoff.
FAST_BACKOFF = {"type": "exponential", "initial": 10, "max": 10}


async def record_start(ctx: Context, job_id: str) -> None:
    await ctx.cache("main").native.hset(f"{PREFIX}:started:{os.getpid()}", job_id, 1)


async def record_effect(ctx: Context, job_id: str) -> None:
    await ctx.cache("main").native.hincrby(f"{PREFIX}:done", job_id, 1)


@functools.cache
def _record_file() -> TextIO:
    folder = Path(os.environ["FAULT_RECORDS"])
    return open(folder / f"{os.getpid()}.log", "a", buffering=1)  # the process's, never closed


def record_line(event: str, job_id: str) -> None:
    """One whole line, in one append (line-buffered): a reader never sees half of it."""
    _record_file().write(f"{time.time():.6f} {event} {job_id}\n")


class BusyJob(Job):
    """Many short jobs with 20 in flight: the SIGKILL test kills a worker in the middle."""

    subject = f"{PREFIX}.busy"
    bus = "jobs"
    concurrency = 20
    retries = 3
    backoff = FAST_BACKOFF
    ack_wait_s = ACK_WAIT_S

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        await record_start(ctx, payload["id"])
        await asyncio.sleep(0.1)
        await record_effect(ctx, payload["id"])


class SlowJob(Job):
    """Jobs of one second, five in flight: the SIGTERM test drains them."""

    subject = f"{PREFIX}.slow"
    bus = "jobs"
    concurrency = 5
    retries = 3
    backoff = FAST_BACKOFF
    ack_wait_s = 5.0

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        await record_start(ctx, payload["id"])
        await asyncio.sleep(1.0)  # the run itself: long enough to be killed mid-way
        await record_effect(ctx, payload["id"])


class LongJob(Job):
    """Runs `sleep_s` (default a minute) unless cancelled; records its start, its effect and,
    in `<prefix>:cancelled:<pid>`, a cancel that reached it mid-run."""

    subject = f"{PREFIX}.long"
    bus = "jobs"
    concurrency = 4
    retries = 3
    backoff = FAST_BACKOFF
    ack_wait_s = 5.0

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        await record_start(ctx, payload["id"])
        try:
            await asyncio.sleep(payload.get("sleep_s", 60))
        except asyncio.CancelledError:
            cancelled = f"{PREFIX}:cancelled:{os.getpid()}"
            await asyncio.shield(ctx.cache("main").native.hset(cancelled, payload["id"], 1))
            raise
        await record_effect(ctx, payload["id"])


class CrashJob(Job):
    """Ends its worker process, as a segfault or an OOM kill would: no ack, no nak, nothing."""

    subject = f"{PREFIX}.crash"
    bus = "jobs"
    retries = 1
    backoff = FAST_BACKOFF
    ack_wait_s = ACK_WAIT_S

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        redis = ctx.cache("main").native
        runs = await redis.hincrby(f"{PREFIX}:runs", payload["id"], 1)
        await redis.hset(f"{PREFIX}:ran_on", f"{payload['id']}:{runs}", ctx.instance_id)
        os._exit(1)


class ClusterJob(Job):
    """Jobs on a stream with three replicas, for the cluster test that kills the stream leader:
    20 in flight, 20 ms each, so 5,000 of them take a few seconds on two workers."""

    subject = f"{PREFIX}.cluster"
    bus = "jobs"
    concurrency = 20
    retries = 5
    backoff = FAST_BACKOFF
    ack_wait_s = 2.0
    replicas = 3

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        await record_start(ctx, payload["id"])
        await asyncio.sleep(0.02)
        await record_effect(ctx, payload["id"])


class FailoverJob(Job):
    """Jobs of 10 ms, 20 in flight per worker, for the test that kills the Redis Cluster master
    of their slot: each run appends `done <job id>` to its process's record file (FAULT_RECORDS),
    which no failover touches. A 1 s ack wait: the jobs in flight on the dead master come back
    soon after the promotion."""

    subject = f"{PREFIX}.failover"
    bus = "jobs"
    concurrency = 20
    retries = 5
    backoff = FAST_BACKOFF
    ack_wait_s = ACK_WAIT_S

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        await asyncio.sleep(0.01)
        record_line("done", payload["id"])


class TimedJob(ClusterJob):
    """ClusterJob's queue (three replicas, 20 in flight) with jobs of 100 ms: 5,000 of them
    keep two workers busy for 25 s, through a 10 s network fault. The ack wait is the default,
    the one a fault leaves unacked jobs to wait out. Starts and effects go to files
    (FAULT_RECORDS): these workers run in a network namespace that reaches the NATS nodes only."""

    subject = f"{PREFIX}.timed"
    ack_wait_s = DEFAULT_ACK_WAIT_S

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        record_line("start", payload["id"])
        await asyncio.sleep(0.1)
        record_line("done", payload["id"])


class ThrottledJob(Job):
    """At most 20 starts a second across every worker (the config's `main` cache keeps the
    count); each start goes to the record files (FAULT_RECORDS)."""

    subject = f"{PREFIX}.throttled"
    bus = "jobs"
    concurrency = 100
    rate_limit = {"limit": 20, "period_s": 1.0}

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        record_line("start", payload["id"])


class Member(Job):
    """A member of the workflow fault test's group: 0.2-0.4 s, then twice its `n`. Its
    concurrency is the fleet's on NATS and each process's elsewhere: the test sets it so that
    every driver runs as many at once (FAULT_MEMBER_CONCURRENCY)."""

    subject = f"{PREFIX}.member"
    bus = "jobs"
    concurrency = int(os.environ.get("FAULT_MEMBER_CONCURRENCY", "6"))
    retries = 8
    backoff = FAST_BACKOFF
    ack_wait_s = ACK_WAIT_S

    async def run(self, payload: dict[str, Any], ctx: Context) -> int:
        await asyncio.sleep(0.2 + 0.2 * random.random())
        return int(payload["n"]) * 2


class FanIn(Job):
    """The group's callback: each run is a line `callback <outcomes>:<done>:<sum of results>`
    in the record files (FAULT_RECORDS)."""

    subject = f"{PREFIX}.fanin"
    bus = "jobs"
    retries = 3
    backoff = FAST_BACKOFF
    ack_wait_s = ACK_WAIT_S

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        outcomes = payload["outcomes"]
        done = [o for o in outcomes if o["state"] == "done"]
        total = sum(o["result"] for o in done)
        record_line("callback", f"{len(outcomes)}:{len(done)}:{total}")
