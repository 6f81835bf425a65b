"""Events and listener groups for tests/mega/events/test_events_faults.py, run by real
`mega worker` processes (and by relay_process.py).

Names and Redis keys carry a prefix from the environment (FAULT_PREFIX), so every test has its
own. What each run does is recorded in the config's `main` cache:

    <prefix>:runs:<group>    hash, event id -> n    the group's listener ran n times for it
    <prefix>:pids:<group>    set of the processes that ran the group's listener
    <prefix>:jobs            hash, job id -> n      Shipped ran n times for it (enqueued through
                                                    the outbox, `outbox.enqueue`)
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from mega import Context, Event, Job, JobContext, Listener, ReceivedEvent

PREFIX = os.environ.get("FAULT_PREFIX", "faults")
ACK_WAIT_S = 2.0


class Happened(Event):
    name = f"{PREFIX}.happened"
    bus = "jobs"


class Recorder(Listener):
    event = Happened
    concurrency = 10
    ack_wait_s = ACK_WAIT_S
    backoff = {"type": "exponential", "initial": 10, "max": 10}

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        redis = ctx.cache("main").native
        prefix = event.name.split(".", 1)[0]  # the test's, also where no FAULT_PREFIX is set
        data = event.data if isinstance(event.data, dict) else {}
        await asyncio.sleep(data.get("sleep_s", 0.001))
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(f"{prefix}:runs:{self.group}", event.id, 1)
            pipe.sadd(f"{prefix}:pids:{self.group}", os.getpid())
            await pipe.execute()


class GroupA(Recorder):
    group = f"{PREFIX}-a"


class GroupB(Recorder):
    group = f"{PREFIX}-b"


class GroupC(Recorder):
    group = f"{PREFIX}-c"


class Shipped(Job):
    """A job enqueued through the outbox; records its runs by job id."""

    subject = f"{PREFIX}.shipped"
    bus = "jobs"
    concurrency = 10

    async def run(self, payload: Any, ctx: JobContext) -> None:
        prefix = self.subject.split(".", 1)[0]
        await ctx.cache("main").native.hincrby(f"{prefix}:jobs", ctx.job_id, 1)
