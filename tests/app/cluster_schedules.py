"""Schedules for the cluster tests, run by real `mega scheduler` processes.

The key prefix comes from the environment so that every test has its own keys. Each run records
when it started by Redis's clock (`TIME`), not its own: a test may fake the process's clock.
The runs of a dynamic entry of `EverySecond` are counted under their key."""

from __future__ import annotations

import json
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
        # A dynamic entry's runs are counted apart, under its key.
        of = "" if self.key is None else f":{self.key}"
        await redis.hset(f"{PREFIX}:started_us{of}", instant, seconds * 1_000_000 + microseconds)
        await redis.hincrby(f"{PREFIX}:runs{of}", instant, 1)
        await redis.hset(f"{PREFIX}:winner{of}", instant, self.tick.instance_id)
        if self.key is not None:
            await redis.hset(f"{PREFIX}:args{of}", instant, json.dumps(self.args))
