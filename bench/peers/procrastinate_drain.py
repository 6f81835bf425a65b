"""The procrastinate peer of bench/bench_postgres.py, run by the peers' own virtualenv
(.venv-peers): procrastinate's schema applied to the database, N no-op tasks deferred in batches
of 1,000 (untimed), then one worker with its defaults (concurrency 1: it fetches one job per
query; jobs kept once done, its `delete_jobs="never"`) that stops once the queue is empty, timed
until every task has run. Prints one JSON line, {"jobs_per_s": ..., "ran": n,
"exactly_once": true|false, "left": rows}, "left" being the jobs not in the `succeeded` state
once the worker has stopped (0: nothing would run again).

    .venv-peers/bin/python bench/peers/procrastinate_drain.py POSTGRES_URL JOBS

A safety net: after drain.STALL_S without progress it reports what ran ("ran" < JOBS).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter

from drain import report, until_all_ran  # beside this script (see drain.py)
from procrastinate import App, PsycopgConnector

DEFER_BATCH = 1_000


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

        worker = asyncio.create_task(
            app.run_worker_async(wait=False, install_signal_handlers=False)
        )
        elapsed = await until_all_ran(ran, jobs, worker)
        await asyncio.wait_for(worker, 30)  # `wait=False`: it stops once the queue is empty
        rows = await app.connector.execute_query_one_async(
            "SELECT count(*) FILTER (WHERE status <> 'succeeded') AS left FROM procrastinate_jobs"
        )
    return report(ran, jobs, elapsed, rows["left"], "jobs")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drain(sys.argv[1], int(sys.argv[2])))), flush=True)
