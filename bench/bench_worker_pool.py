"""Trivial tasks/s through WorkerPool vs concurrent.futures.ProcessPoolExecutor (SPEC section 7).

    .venv/bin/python bench/bench_worker_pool.py [--tasks 20000] [--in-flight 64] [--workers 2]

Both sides get the same worker count, the same no-op task and the same number of tasks kept in
flight, in the same run. Two baselines are timed: the executor driven from asyncio
(`loop.run_in_executor`, how a web handler would use it) and its own synchronous `submit`
window; the ratio is taken against the faster of the two. Target: ratio >= 2.0.

This file is also the pool's task module: `noop` is its only public function, hence the
underscores everywhere else, and its top level imports nothing heavy.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `app` importable
    sys.path.insert(0, str(ROOT))

TARGET_RATIO = 2.0  # SPEC section 7: the pool must be at least this much faster
WARMUP_TASKS = 500  # untimed, so both sides have started their processes and warmed caches


def noop(args: int) -> int:
    """The trivial task: returns its argument."""
    return args


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
    # Imported here, not at the top: the children import this file as their task module.
    from app.mega.worker import Worker, WorkerPool

    class BenchWorker(Worker):
        task_file = "bench/bench_worker_pool.py"
        pool_size = workers
        max_queue = in_flight

    pool = WorkerPool(BenchWorker, root=ROOT)
    await pool.start()
    try:

        async def submit(n: int) -> int:
            result: int = await pool.run("noop", n)
            return result

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
    def run(count: int) -> float:
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
        run(WARMUP_TASKS)
        return run(tasks)


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args()
    shape = (options.workers, options.tasks, options.in_flight)

    executor_sync = _bench_executor_sync(*shape)
    executor_async = asyncio.run(_bench_executor_async(*shape))
    pool = asyncio.run(_bench_pool(*shape))
    baseline = max(executor_sync, executor_async)
    ratio = pool / baseline

    print(f"{options.tasks} no-op tasks, {options.workers} workers, {options.in_flight} in flight")
    print(f"{'runner':<40} {'tasks/s':>10}")
    print(f"{'ProcessPoolExecutor (submit window)':<40} {executor_sync:>10,.0f}")
    print(f"{'ProcessPoolExecutor (run_in_executor)':<40} {executor_async:>10,.0f}")
    print(f"{'WorkerPool (process mode)':<40} {pool:>10,.0f}")
    verdict = "ok" if ratio >= TARGET_RATIO else "BELOW TARGET"
    print(f"ratio vs the faster executor: {ratio:.2f}x (target >= {TARGET_RATIO}x): {verdict}")
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(_main())
