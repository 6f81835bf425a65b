"""Trivial tasks/s through WorkerPool vs concurrent.futures.ProcessPoolExecutor.

    .venv/bin/python -m bench.bench_worker_pool [--tasks 20000] [--in-flight 64] [--workers 2]

Both sides get the same worker count, the same no-op task (`bench.noop_tasks.noop`) and the
same number of tasks kept in flight, in the same run. Two baselines are timed: the executor
driven from asyncio (`loop.run_in_executor`, how a web handler would use it) and its own
synchronous `submit` window; the ratio is taken against the faster of the two.
Target: ratio >= 2.0. Takes a few seconds; needs no server.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

if __package__ in (None, ""):  # run by path (python bench/x.py): make `app`, `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.noop_tasks import noop
from bench.report import Result, print_table, result, row
from mega.workers.pool import WorkerPool
from mega.workers.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 2.0  # the target: the pool must be at least this much faster
WARMUP_TASKS = 500  # untimed, so both sides have started their processes and warmed caches


async def _windowed(submit: Callable[[int], Awaitable[int]], tasks: int, in_flight: int) -> float:
    """Run `tasks` calls keeping `in_flight` outstanding; return tasks per second."""
    counter = iter(range(tasks))

    async def lane() -> None:
        for n in counter:
            assert await submit(n) == n

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return tasks / (time.perf_counter() - started)


async def _bench_pool(workers: int, tasks: int, in_flight: int) -> float:
    class BenchWorker(Worker):
        task_file = "bench/noop_tasks.py"
        pool_size = workers
        max_queue = in_flight

    pool = WorkerPool(BenchWorker, root=ROOT)
    await pool.start()
    try:

        async def submit(n: int) -> int:
            value: int = await pool.run("noop", n)
            return value

        await _windowed(submit, WARMUP_TASKS, in_flight)
        return await _windowed(submit, tasks, in_flight)
    finally:
        await pool.stop()


async def _bench_executor_async(workers: int, tasks: int, in_flight: int) -> float:
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(workers) as executor:

        async def submit(n: int) -> int:
            return await loop.run_in_executor(executor, noop, n)

        await _windowed(submit, WARMUP_TASKS, in_flight)
        return await _windowed(submit, tasks, in_flight)


def _bench_executor_sync(workers: int, tasks: int, in_flight: int) -> float:
    def window(count: int) -> float:
        started = time.perf_counter()
        pending: set[concurrent.futures.Future[int]] = set()
        for n in range(count):
            if len(pending) >= in_flight:
                _, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
            pending.add(executor.submit(noop, n))
        concurrent.futures.wait(pending)
        return count / (time.perf_counter() - started)

    with concurrent.futures.ProcessPoolExecutor(workers) as executor:
        window(WARMUP_TASKS)
        return window(tasks)


def run(tasks: int = 20_000, in_flight: int = 64, workers: int = 2) -> Result:
    """Time the three runners one after the other; print and return the table."""
    shape = (workers, tasks, in_flight)
    executor_sync = _bench_executor_sync(*shape)
    executor_async = asyncio.run(_bench_executor_async(*shape))
    pool = asyncio.run(_bench_pool(*shape))
    baseline = max(executor_sync, executor_async)
    ratio = pool / baseline
    res = result(
        "worker_pool",
        "CPU worker pool: trivial tasks/s",
        f"{tasks:,} no-op tasks, {workers} workers, {in_flight} in flight",
        [
            row("ProcessPoolExecutor, submit window (tasks/s)", executor_sync),
            row("ProcessPoolExecutor, run_in_executor (tasks/s)", executor_async),
            row(
                "WorkerPool, process mode (tasks/s)",
                pool,
                baseline=baseline,
                baseline_name="faster executor",
                target=f">= {TARGET_RATIO}x",
                passed=ratio >= TARGET_RATIO,
            ),
        ],
        data={
            "pool_tasks_per_s": pool,
            "executor_sync_tasks_per_s": executor_sync,
            "executor_async_tasks_per_s": executor_async,
            "ratio": ratio,
        },
    )
    print_table(res)
    return res


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    res = run(tasks=options.tasks, in_flight=options.in_flight, workers=options.workers)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
