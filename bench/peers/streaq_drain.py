"""The streaq peer of bench/bench_drivers.py, run by the peers' own virtualenv (.venv-peers):
streaq (Redis streams, on coredis), N no-op tasks enqueued in pipelined batches by
`Worker.enqueue_many` (untimed), then one worker with its defaults (concurrency 16, so a
prefetch of 32 messages; results kept, as by default) in burst mode, timed until every task has
run; it stops once the stream is empty. Prints one JSON line, {"tasks_per_s": ..., "ran": n,
"exactly_once": true|false, "left": n}, "left" being its queue size once the worker has stopped
(0: nothing would run again).

    .venv-peers/bin/python bench/peers/streaq_drain.py REDIS_URL JOBS QUEUE

On the benchmark's valkey, whose XREADGROUP has no CLAIM option, streaq reads the stream
through its Lua script, as it does on any server without it.

A safety net: after drain.STALL_S without progress it reports what ran ("ran" < JOBS); a
message lost in flight would wait for streaq's `idle_timeout` (60 s by default) to run again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

from drain import report, until_all_ran  # beside this script (see drain.py)
from streaq import Worker

ENQUEUE_BATCH = 1_000


async def drain(url: str, jobs: int, queue: str) -> dict[str, object]:
    worker = Worker(redis_url=url, queue_name=queue)
    ran: Counter[int] = Counter()

    @worker.task
    async def noop(n: int) -> None:
        ran[n] += 1

    async with worker:
        for first in range(0, jobs, ENQUEUE_BATCH):
            batch = range(first, min(first + ENQUEUE_BATCH, jobs))
            await worker.enqueue_many([noop.enqueue(n) for n in batch])
    worker.burst = True  # what `streaq run --burst` sets: stop once the queue is empty

    running = asyncio.create_task(worker.run_async())
    elapsed = await until_all_ran(ran, jobs, running)
    await asyncio.wait_for(running, 30)
    async with worker:
        left = await worker.queue_size()
    return report(ran, jobs, elapsed, left, "tasks")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drain(sys.argv[1], int(sys.argv[2]), sys.argv[3]))), flush=True)
