"""Fair jobs: how long a small key waits behind a flood, and what taking turns costs.

    .venv/bin/python -m bench.bench_fair [--flood 10000]

On each driver (memory; nats, redis and postgres on private embedded servers):

1. The small key's wait. Key "big" enqueues a flood of no-op jobs, key "small" one job after
   them; then one consume loop (concurrency 200) starts, and the time from its start to the
   start of small's job is taken: in order (fair off), and with `fair = True`.
   And a job's wait with `priority="high"` behind a flood of `"low"` ones (`prioritized =
   True`), against the same in order.
2. The rate of a fair job with one key: the same flood, all of one key, drained with fair off
   and with fair on. Target: fair >= 0.8x fair off. Rounds alternate the two, the best of each
   kept (the machine's pace moves). Every job is checked to have run exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_drivers import Noop, _drain, driver_context
from bench.report import Result, ms, print_table, result, row
from mega import Context, JobRunner

ROUNDS = 2
RATE_TARGET = 0.8
SMALL = -1  # the small key's job's payload
SMALL_STARTED: list[float] = []  # perf_counter when small's job started


class InOrder(Noop):
    subject = "bench.inorder"

    async def run(self, payload: int, ctx: Context) -> None:
        if payload == SMALL:
            SMALL_STARTED.append(time.perf_counter())
            return
        await super().run(payload, ctx)


class Fair(InOrder):
    subject = "bench.fair"
    fair = True


# The waits' own queues: what is left of their floods stays there, out of the rates' way.
class InOrderWait(InOrder):
    subject = "bench.inorder.wait"


class FairWait(Fair):
    subject = "bench.fair.wait"


class RankedWait(InOrder):
    subject = "bench.ranked.wait"
    prioritized = True


async def small_wait_s(ctx: Context, job: type[InOrder], flood: int) -> float:
    """Seconds from a consume loop's start to the start of small's job, behind big's flood
    (on a prioritized job: small's is high, the flood low)."""
    SMALL_STARTED.clear()
    worker = JobRunner(ctx)
    worker.register(job)
    queue = worker.queue("jobs")
    if job.prioritized:
        await queue.enqueue_many(job, range(flood), priority="low")
        await queue.enqueue(job, SMALL, priority="high")
    else:
        await queue.enqueue_many(job, range(flood), key="big")
        await queue.enqueue(job, SMALL, key="small")
    started = time.perf_counter()
    await worker.start()
    while not SMALL_STARTED:
        await asyncio.sleep(0.001)
    await worker.stop(0)
    return SMALL_STARTED[0] - started


async def measure(driver: str, url: str, flood: int) -> dict[str, float]:
    ctx = await driver_context(driver, url)
    try:
        fifo_wait = await small_wait_s(ctx, InOrderWait, flood)
        fair_wait = await small_wait_s(ctx, FairWait, flood)
        high_wait = await small_wait_s(ctx, RankedWait, flood)
        off = on = 0.0
        for _ in range(ROUNDS):
            off = max(off, await _drain(ctx, flood, InOrder, key="one"))
            on = max(on, await _drain(ctx, flood, Fair, key="one"))
    finally:
        await ctx.buses["jobs"].close()
    return {
        "fifo_wait_s": fifo_wait,
        "fair_wait_s": fair_wait,
        "high_wait_s": high_wait,
        "off": off,
        "on": on,
    }


async def _bench(flood: int) -> Result:
    from mega.drivers.nats.embedded import EmbeddedNats
    from mega.drivers.postgres.embedded import EmbeddedPostgres
    from mega.drivers.redis.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory(prefix="bench-fair-") as tmp:
        nats = EmbeddedNats(Path(tmp) / "nats").start()
        redis = EmbeddedRedis(Path(tmp) / "redis").start()
        postgres = EmbeddedPostgres(Path(tmp) / "postgres", fast=True).start()
        try:
            found = {
                "memory": await measure("memory", "", flood),
                "nats": await measure("nats", nats.url, flood),
                "redis": await measure("redis", redis.url, flood),
                "postgres": await measure("postgres", postgres.url, flood),
            }
        finally:
            for server in (nats, redis, postgres):
                server.stop()
    rows = []
    for driver, figures in found.items():
        rows += [
            row(f"{driver}: small's wait, in order", figures["fifo_wait_s"] * 1000, show=ms),
            row(
                f"{driver}: small's wait, fair",
                figures["fair_wait_s"] * 1000,
                show=ms,
                baseline=figures["fifo_wait_s"] * 1000,
                baseline_name="in order",
            ),
            row(
                f"{driver}: a high job's wait behind low",
                figures["high_wait_s"] * 1000,
                show=ms,
                baseline=figures["fifo_wait_s"] * 1000,
                baseline_name="in order",
            ),
            row(f"{driver}: one key, fair off (jobs/s)", figures["off"]),
            row(
                f"{driver}: one key, fair on (jobs/s)",
                figures["on"],
                baseline=figures["off"],
                baseline_name="fair off",
                target=f">= {RATE_TARGET}x",
                passed=figures["on"] >= RATE_TARGET * figures["off"],
            ),
        ]
    res = result(
        "fair",
        "Fair jobs: a small key's wait behind a flood, and the rate with one key; priorities",
        f"{flood:,} no-op jobs of key big, then one of key small; one consume loop, "
        "concurrency 200; nats, redis (valkey) and postgres (fast=True) on private embedded "
        "servers",
        rows,
        notes=[
            "in order, small's job starts after the whole flood; fair, at the first turns; a "
            "high job behind a flood of low ones (prioritized), at the first of high's turns",
            "the postgres driver walks a fair lane's keys in an index and takes each key's "
            "oldest rows at each claim (never every row waiting); the redis driver moves each "
            "job from its key's list into the stream at its turn (one Lua script per read); "
            "the nats driver from "
            "its key's subject onto the lane (batched direct gets, a pipelined publish, a "
            "purge per key: a few round trips per feed)",
            f"rates: best of {ROUNDS} alternated rounds; every job checked to have run once",
        ],
        data=found,
    )
    print_table(res)
    return res


def run(flood: int = 10_000) -> Result:
    return asyncio.run(_bench(flood))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--flood", type=int, default=10_000)
    return 0 if run(parser.parse_args().flood)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
