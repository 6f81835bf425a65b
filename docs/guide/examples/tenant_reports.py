"""A config of its own for the schedules chapter: one Schedule class run per tenant, as dynamic
entries added, changed and removed with `mega schedules add/remove` while schedulers run.

    MEGA_CONFIG=docs/guide/examples/tenant_reports.py .venv/bin/mega scheduler   (start two)
    .venv/bin/python docs/guide/examples/tenant_reports.py                        (what ran)

Each run counts itself under its entry's key and planned instant; run as a script, this prints
the runs of each key, the changes of the entries in the audit (who added, changed or removed
which key), and fails if any instant of any key ran twice.
"""

from __future__ import annotations

import asyncio
import json
import os

from mega import Context, Schedule, Scheduler, load_config
from mega.runtime import boot, shutdown

KEY = "guide:tenant-reports"


class TenantReport(Schedule):
    cron = None  # no ticks of its own: it runs through its entries only (a cron here would too)
    timezone = "UTC"
    lock = {"lock": "main", "ttl": 5_000, "key": KEY}

    async def run(self, ctx: Context) -> None:
        instant = int(self.tick.instant.timestamp())
        redis = ctx.cache("main").native
        await redis.hincrby(f"{KEY}:runs", f"{self.key}:{instant}", 1)
        await redis.hset(f"{KEY}:args", str(self.key), json.dumps(self.args))


services = {
    "caches": {"main": {"driver": "redis", "url": os.environ.get("REDIS_URL", "")}},
    "locks": {"main": {"driver": "redlock", "caches": ["main"]}},
}
schedules = [TenantReport]


async def print_runs() -> None:
    ctx = await boot(load_config(__file__, signs=False), role="script", database=False)
    try:
        redis = ctx.cache("main").native
        runs = {name: int(count) for name, count in (await redis.hgetall(f"{KEY}:runs")).items()}
        args = await redis.hgetall(f"{KEY}:args")  # the cache's client decodes replies to str
        for key in sorted({name.rsplit(":", 1)[0] for name in runs}):
            instants = sorted(int(n.rsplit(":", 1)[1]) for n in runs if n.startswith(f"{key}:"))
            seconds = [instant % 60 for instant in instants]
            print(f"{key}: {len(instants)} runs, at seconds {seconds}, args {args[key]}")
        scheduler = Scheduler(ctx).register(TenantReport)
        for row in await scheduler.recent_ticks("TenantReport", limit=200):
            if row["source"] in ("add", "change", "remove"):
                reason = row["skipped"][0]["reason"]
                print(f"{row['instant']}  {row['source']}  {row['key']}  {reason}")
        assert set(runs.values()) <= {1}, "an instant ran twice"
    finally:
        await shutdown(ctx)


if __name__ == "__main__":
    asyncio.run(print_runs())
