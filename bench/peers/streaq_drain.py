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

A safety net: after STALL_S without progress it reports what ran ("ran" < JOBS); a message lost
in flight would wait for streaq's `idle_timeout` (60 s by default) to run again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter

from streaq import Worker

ENQUEUE_BATCH = 1_000
STALL_S = 10.0


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

    started = time.perf_counter()
    running = asyncio.create_task(worker.run_async())
    progress_at, seen = started, 0
    while len(ran) < jobs and not running.done():
        await asyncio.sleep(0.001)
        if len(ran) != seen:
            progress_at, seen = time.perf_counter(), len(ran)
        elif time.perf_counter() - progress_at > STALL_S:
            break
    elapsed = time.perf_counter() - started
    await asyncio.wait_for(running, 30)
    async with worker:
        left = await worker.queue_size()
    exactly_once = set(ran.values()) == {1} and sorted(ran) == list(range(jobs)) and left == 0
    return {
        "tasks_per_s": jobs / elapsed,
        "ran": len(ran),
        "exactly_once": exactly_once,
        "left": left,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drain(sys.argv[1], int(sys.argv[2]), sys.argv[3]))), flush=True)
