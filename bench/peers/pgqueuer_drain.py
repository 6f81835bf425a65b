"""The pgqueuer peer of bench/bench_postgres.py, run by the peers' own virtualenv (.venv-peers):
pgqueuer's tables installed in the database, N no-op jobs enqueued in one batch insert
(untimed), then one QueueManager (batch size 100, its default concurrency: no cap on the jobs
in flight) timed until every job has run. On asyncpg, its first driver (on its psycopg
driver it ran about 3x slower here). Prints one JSON line,
{"jobs_per_s": ..., "ran": n, "exactly_once": true|false, "left": rows}, "left" being the rows
still in its queue table once the worker has stopped (0: nothing would run again).

    .venv-peers/bin/python bench/peers/pgqueuer_drain.py POSTGRES_URL JOBS

A safety net: after drain.STALL_S without progress it reports what ran ("ran" < JOBS).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

import asyncpg
from drain import report, until_all_ran  # beside this script (see drain.py)
from pgqueuer import Job, PgQueuer, Queries
from pgqueuer.types import QueueExecutionMode

BATCH = 100


async def drain(url: str, jobs: int) -> dict[str, object]:
    ran: Counter[int] = Counter()
    setup = await asyncpg.connect(url)
    queries = Queries.from_asyncpg_connection(setup)
    await queries.install()
    await queries.enqueue(["noop"] * jobs, [str(n).encode() for n in range(jobs)], [0] * jobs)

    connection = await asyncpg.connect(url)
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        ran[int(job.payload or b"-1")] += 1

    worker = asyncio.create_task(pgq.qm.run(batch_size=BATCH, mode=QueueExecutionMode.drain))
    elapsed = await until_all_ran(ran, jobs, worker)
    pgq.qm.shutdown.set()  # drain mode would also stop, after its idle poll: no need to wait
    await asyncio.wait_for(worker, 30)  # flushes the finished jobs' statuses on the way out
    await connection.close()
    left = await setup.fetchval("SELECT count(*) FROM pgqueuer")
    await setup.close()
    return report(ran, jobs, elapsed, left, "jobs")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drain(sys.argv[1], int(sys.argv[2])))), flush=True)
