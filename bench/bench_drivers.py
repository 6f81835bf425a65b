"""The other bus drivers: the memory driver's no-op jobs/s in one process, and
the redis driver against a bare redis-py loop on the same server.

    .venv/bin/python -m bench.bench_drivers [--jobs 20000]

Memory: `enqueue_many` of N no-op jobs, then one consume loop (concurrency 200) until every one
has run; target >= 50,000 jobs/s. Redis: N entries XADDed to a stream on a private Redis;
baseline: XREADGROUP(count=100) with one awaited XACK per entry; mega: the same backlog through
the redis driver (concurrency 200, each entry acked and deleted after its run); target >= 1.0x.
Peer: taskiq on Redis streams (`taskiq-redis`'s RedisStreamBroker, in its own virtualenv:
bench/peers/taskiq_redis_drain.py), N tasks kicked one at a time, then its receiver in that
process (200 async tasks, reads of 100) until every one has run; target: the redis driver
>= 3x. Peer: streaq (Redis streams too, bench/peers/streaq_drain.py in the same virtualenv), N
tasks enqueued in pipelined batches of 1,000, then one worker with its defaults (concurrency
16, prefetch 32) until every one has run; reported, no target. Every job is checked to have run
exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import run_peer
from bench.report import Result, print_table, result, row
from mega import Context, Job, JobRunner
from mega.drivers import find_driver
from mega.settings import BusSpec

MEMORY_TARGET = 50_000.0
REDIS_TARGET = 1.0  # the redis driver >= this x the bare XREADGROUP + XACK loop
TASKIQ_TARGET = 3.0  # and >= this x taskiq on Redis streams
TASKIQ_ATTEMPTS = 4
RAN: Counter[int] = Counter()


class Noop(Job):
    subject = "bench.noop"
    bus = "jobs"
    concurrency = 200
    retries = 0

    async def run(self, payload: int, ctx: Context) -> None:
        RAN[payload] += 1


async def driver_context(driver: str, url: str) -> Context:
    """A Context whose `jobs` bus is connected on `driver` at `url`, as boot would."""
    bus = await find_driver(driver).connect("jobs", BusSpec(driver=driver, url=url))
    return Context(instance_id="bench", buses={"jobs": bus})


async def _drain(ctx: Context, jobs: int, job: type[Job] = Noop, key: str | None = None) -> float:
    """Enqueue `jobs` no-op jobs (untimed; with `key`, all of that key), then time one consume
    loop until all have run. `job` counts its runs in RAN, as Noop does."""
    RAN.clear()
    worker = JobRunner(ctx)
    worker.register(job)
    await worker.queue("jobs").enqueue_many(job, range(jobs), key=key)
    started = time.perf_counter()
    await worker.start()
    while len(RAN) < jobs:
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - started
    await worker.stop(5)
    assert set(RAN.values()) == {1} and sorted(RAN) == list(range(jobs)), "not exactly once"
    return jobs / elapsed


async def _bare_redis(redis: Any, jobs: int) -> float:
    key = "bench:bare"
    await redis.delete(key)
    await redis.xgroup_create(key, "g", id="0", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(jobs):
            pipe.xadd(key, {"body": str(n)})
        await pipe.execute()
    seen: Counter[bytes] = Counter()
    started = time.perf_counter()
    while len(seen) < jobs:
        answer = await redis.xreadgroup("g", "c", {key: ">"}, count=100, block=100)
        for _, entries in answer or []:
            for entry_id, fields in entries:
                seen[fields[b"body"]] += 1
                await redis.xack(key, "g", entry_id)
    return jobs / (time.perf_counter() - started)


async def _taskiq_redis(url: str, jobs: int) -> tuple[float, int]:
    """taskiq on Redis streams, in the peers' virtualenv (bench/peers/taskiq_redis_drain.py):
    the first complete run of up to TASKIQ_ATTEMPTS, each on a fresh queue; also how many runs
    stalled short of the end before it."""
    for attempt in range(TASKIQ_ATTEMPTS):
        answer = await run_peer("taskiq_redis_drain.py", url, str(jobs), f"bench:taskiq:{attempt}")
        if answer["ran"] == jobs:
            assert answer["exactly_once"], "taskiq: not exactly once"
            return float(answer["tasks_per_s"]), attempt
    raise AssertionError(f"taskiq: no complete run in {TASKIQ_ATTEMPTS} attempts")


async def _streaq(url: str, jobs: int) -> float:
    """streaq on Redis streams, in the peers' virtualenv (bench/peers/streaq_drain.py)."""
    answer = await run_peer("streaq_drain.py", url, str(jobs), "bench-streaq")
    assert answer["ran"] == jobs, f"streaq: {answer['ran']} of {jobs} tasks ran"
    assert answer["exactly_once"], f"streaq: not exactly once ({answer['left']} left queued)"
    return float(answer["tasks_per_s"])


async def _bench(jobs: int) -> Result:
    from redis.asyncio import Redis

    from mega.drivers.redis.embedded import EmbeddedRedis

    memory = await _drain(await driver_context("memory", ""), jobs)

    with tempfile.TemporaryDirectory(prefix="bench-drivers-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        client: Any = Redis.from_url(server.url)
        try:
            bare = await _bare_redis(client, jobs)
            redis_ctx = await driver_context("redis", server.url)
            try:
                redis = await _drain(redis_ctx, jobs)
            finally:
                await redis_ctx.bus("jobs").close()
            taskiq, stalled = await _taskiq_redis(server.url, jobs)
            streaq = await _streaq(server.url, jobs)
        finally:
            await client.aclose()
            server.stop()
    res = result(
        "drivers",
        "Bus drivers: memory and redis",
        f"{jobs:,} no-op jobs per run, concurrency 200; a private Redis-compatible server",
        [
            row(
                "memory driver (jobs/s)",
                memory,
                target=f">= {MEMORY_TARGET:,.0f}/s",
                passed=memory >= MEMORY_TARGET,
            ),
            row("bare XREADGROUP(count=100) + XACK each (entries/s)", bare),
            row(
                "redis driver (jobs/s)",
                redis,
                baseline=bare,
                baseline_name="bare loop",
                target=f">= {REDIS_TARGET}x",
                passed=redis / bare >= REDIS_TARGET,
            ),
            row("taskiq-redis stream broker, one receiver (tasks/s)", taskiq),
            row(
                "redis driver against taskiq on Redis (jobs/s)",
                redis,
                baseline=taskiq,
                baseline_name="taskiq-redis",
                target=f">= {TASKIQ_TARGET}x",
                passed=redis / taskiq >= TASKIQ_TARGET,
            ),
            row("streaq, one worker, its defaults: concurrency 16 (tasks/s)", streaq),
            row(
                "redis driver against streaq (jobs/s)",
                redis,
                baseline=streaq,
                baseline_name="streaq",
            ),
        ],
        notes=[
            "every job (and every taskiq and streaq task) checked to have run exactly once",
            f"taskiq: runs stalled short of the end and run again on a fresh queue: {stalled} "
            "(see bench/peers/taskiq_redis_drain.py)",
        ],
        data={
            "memory_jobs_per_s": memory,
            "redis_jobs_per_s": redis,
            "bare_per_s": bare,
            "taskiq_redis_per_s": taskiq,
            "streaq_per_s": streaq,
        },
    )
    print_table(res)
    return res


def run(jobs: int = 20_000) -> Result:
    return asyncio.run(_bench(jobs))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    return 0 if run(parser.parse_args().jobs)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
