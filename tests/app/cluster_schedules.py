"""Schedules for the cluster tests, run by real `mega scheduler` processes.

The key prefix comes from the environment so that every test has its own keys. Each run records
when it started by Redis's clock (`TIME`), not its own: a test may fake the process's clock."""

from __future__ import annotations

import os

from mega import Context, Schedule

PREFIX = os.environ.get("CLUSTER_PREFIX", "cluster")


class EverySecond(Schedule):
    cron = "* * * * * *"
    timezone = "UTC"
    # The overlap guard outlives a killed winner by at most 900 ms: less than one tick.
    lock = {"lock": "main", "ttl": 900, "key": f"{PREFIX}:lock"}

    async def run(self, ctx: Context) -> None:
        redis = ctx.cache("main").native
        seconds, microseconds = await redis.time()
        instant = str(int(self.tick.instant.timestamp()))
        await redis.hset(f"{PREFIX}:started_us", instant, seconds * 1_000_000 + microseconds)
        await redis.hincrby(f"{PREFIX}:runs", instant, 1)
        await redis.hset(f"{PREFIX}:winner", instant, self.tick.instance_id)
