"""The procrastinate peer of bench/bench_postgres.py, run by the peers' own virtualenv
(.venv-peers): procrastinate's schema applied to the database, N no-op tasks deferred in batches
of 1,000 (untimed), then one worker with its defaults (concurrency 1: it fetches one job per
query; jobs kept once done, its `delete_jobs="never"`) that stops once the queue is empty, timed
until every task has run. Prints one JSON line, {"jobs_per_s": ..., "ran": n,
"exactly_once": true|false, "left": rows}, "left" being the jobs not in the `succeeded` state
once the worker has stopped (0: nothing would run again).

    .venv-peers/bin/python bench/peers/procrastinate_drain.py POSTGRES_URL JOBS

A safety net: after STALL_S without progress it reports what ran ("ran" < JOBS).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import Counter

from procrastinate import App, PsycopgConnector

DEFER_BATCH = 1_000
STALL_S = 10.0


async def drain(url: str, jobs: int) -> dict[str, object]:
    ran: Counter[int] = Counter()
    # It warns that an App made in `__main__` cannot be found by workers in other processes:
    # the one worker here runs in this process.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop(n: int) -> None:
        ran[n] += 1

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for first in range(0, jobs, DEFER_BATCH):
            batch = range(first, min(first + DEFER_BATCH, jobs))
            await noop.batch_defer_async(*({"n": n} for n in batch))

        started = time.perf_counter()
        worker = asyncio.create_task(
            app.run_worker_async(wait=False, install_signal_handlers=False)
        )
        progress_at, seen = started, 0
        while len(ran) < jobs and not worker.done():
            await asyncio.sleep(0.001)
            if len(ran) != seen:
                progress_at, seen = time.perf_counter(), len(ran)
            elif time.perf_counter() - progress_at > STALL_S:
                break
        elapsed = time.perf_counter() - started
        await asyncio.wait_for(worker, 30)  # `wait=False`: it stops once the queue is empty
        rows = await app.connector.execute_query_one_async(
            "SELECT count(*) FILTER (WHERE status <> 'succeeded') AS left FROM procrastinate_jobs"
        )
    left = rows["left"]
    exactly_once = set(ran.values()) == {1} and sorted(ran) == list(range(jobs)) and left == 0
    return {
        "jobs_per_s": jobs / elapsed,
        "ran": len(ran),
        "exactly_once": exactly_once,
        "left": left,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drain(sys.argv[1], int(sys.argv[2])))), flush=True)
