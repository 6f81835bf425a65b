"""The redis driver on a Redis Cluster against one Redis server, and what `durable` costs.

    .venv/bin/python -m bench.bench_redis_cluster [--jobs 20000]

On private embedded servers: one valkey, and a Redis Cluster of three masters with a replica
each (`EmbeddedRedisCluster`). On each: `enqueue_many` of the no-op jobs (timed), then one
consume loop (concurrency 200) timed until every one has run exactly once; then the same with
`durable = True` (the enqueue ends with a WAIT for a replica: on the cluster only, one server
has no replica). One Job class is one hash slot, so one master: the cluster's figure is what
one Job class gets, and more Job classes spread over the masters. Target: the cluster at least
0.8x the one server, consuming. Rounds alternate the two, the best of each kept.
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
from bench.report import Result, print_table, result, row
from mega import Context, JobQueue

ROUNDS = 2
CLUSTER_TARGET = 0.8


# The enqueue rates' own lanes: their jobs are never run (the servers go after the run), so
# they stay out of the consume lane's count.
class Enqueued(Noop):
    subject = "bench.enqueued"


class DurableEnqueued(Noop):
    subject = "bench.durable"
    durable = True


async def enqueue_rate(ctx: Context, job: type[Noop], jobs: int) -> float:
    """`enqueue_many` of `jobs` no-op jobs, jobs/s."""
    queue = JobQueue(ctx, "jobs")
    await queue.ensure(job)
    started = time.perf_counter()
    await queue.enqueue_many(job, range(jobs))
    return jobs / (time.perf_counter() - started)


async def measure(url: str, jobs: int, *, durable: bool) -> dict[str, float]:
    ctx = await driver_context("redis", url)
    found = {"consume": 0.0, "enqueue": 0.0, "durable_enqueue": 0.0}
    try:
        for _ in range(ROUNDS):
            found["consume"] = max(found["consume"], await _drain(ctx, jobs))
            found["enqueue"] = max(found["enqueue"], await enqueue_rate(ctx, Enqueued, jobs))
            if durable:
                rate = await enqueue_rate(ctx, DurableEnqueued, jobs)
                found["durable_enqueue"] = max(found["durable_enqueue"], rate)
    finally:
        await ctx.buses["jobs"].close()
    return found


async def _bench(jobs: int) -> Result:
    from mega.drivers.redis.embedded import EmbeddedRedis, EmbeddedRedisCluster

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        single = EmbeddedRedis(Path(tmp) / "redis").start()
        cluster = EmbeddedRedisCluster(Path(tmp) / "cluster").start()
        try:
            one = await measure(single.url, jobs, durable=False)
            many = await measure(cluster.url, jobs, durable=True)
        finally:
            single.stop()
            cluster.stop()
    rows = [
        row("one server: consume (jobs/s)", one["consume"]),
        row(
            "cluster: consume, one Job class (jobs/s)",
            many["consume"],
            baseline=one["consume"],
            baseline_name="one server",
            target=f">= {CLUSTER_TARGET}x",
            passed=many["consume"] >= CLUSTER_TARGET * one["consume"],
        ),
        row("one server: enqueue_many (jobs/s)", one["enqueue"]),
        row(
            "cluster: enqueue_many (jobs/s)",
            many["enqueue"],
            baseline=one["enqueue"],
            baseline_name="one server",
        ),
        row(
            "cluster: enqueue_many, durable (jobs/s)",
            many["durable_enqueue"],
            baseline=many["enqueue"],
            baseline_name="not durable",
        ),
    ]
    res = result(
        "redis_cluster",
        "The redis driver on a Redis Cluster against one server; durable enqueues",
        f"{jobs:,} no-op jobs per run; one consume loop, concurrency 200; one valkey, and a "
        "cluster of 3 masters with a replica each, on private embedded servers",
        rows,
        notes=[
            "one Job class is one hash slot, so one master: a cluster spreads many Job classes, "
            "not one",
            "durable: the enqueue_many's pipeline ends with WAIT 1 on the master's connection",
            f"best of {ROUNDS} rounds; every job checked to have run once",
        ],
        data={"one": one, "cluster": many},
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
