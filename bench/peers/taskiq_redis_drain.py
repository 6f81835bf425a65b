"""The taskiq peer of bench/bench_drivers.py, run by the peers' own virtualenv (.venv-peers):
taskiq-redis's RedisStreamBroker, N no-op tasks kicked one at a time (untimed), then its receiver
in this process (200 async tasks, reads of 100) timed until every task has run. Prints one JSON
line, {"tasks_per_s": ..., "ran": n, "exactly_once": true|false}, and exits at once: cancelling
taskiq's receiver was seen to hang, and nothing after the figure matters here.

    .venv-peers/bin/python bench/peers/taskiq_redis_drain.py REDIS_URL JOBS QUEUE

A safety net, never seen to fire: after drain.STALL_S without progress it reports what ran ("ran" <
JOBS), and the benchmark tries again on a fresh queue (an entry lost in flight would wait for
taskiq-redis's `idle_timeout`, 10 minutes by default).

Its own virtualenv because taskiq brings aiohttp, and nats-py imports aiohttp whenever it is
installed (its websocket transport): in mega's environment that would add ~10 MB and ~80 ms
to every host the other benchmarks measure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter

from drain import report, until_all_ran  # beside this script (see drain.py)
from taskiq.api.receiver import run_receiver_task
from taskiq_redis import RedisStreamBroker


async def drain(url: str, jobs: int, queue: str) -> dict[str, object]:
    broker = RedisStreamBroker(url, queue_name=queue, consumer_id="0")
    ran: Counter[int] = Counter()

    @broker.task
    async def noop(n: int) -> None:
        ran[n] += 1

    await broker.startup()
    for n in range(jobs):
        await noop.kiq(n)
    receiver = asyncio.create_task(run_receiver_task(broker, max_async_tasks=200))
    elapsed = await until_all_ran(ran, jobs, receiver)
    assert not receiver.done()
    return report(ran, jobs, elapsed, 0, "tasks")


if __name__ == "__main__":
    loop = asyncio.new_event_loop()
    found = loop.run_until_complete(drain(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    print(json.dumps(found), flush=True)
    os._exit(0)
