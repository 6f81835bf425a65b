"""A config of its own for the schedules chapter: one schedule that ticks every second.

    MEGA_CONFIG=docs/guide/examples/every_second.py .venv/bin/mega scheduler   (start two)
    .venv/bin/python docs/guide/examples/every_second.py [--at-least N]         (the tick audit)

Any file with these module-level names is a config (`--config` or MEGA_CONFIG), so an app of
yours reuses the framework this way. Run as a script, it prints the tick audit both schedulers
wrote: one winner per instant, the other instance skipped with "claimed by another instance";
after a `mega schedules pause EverySecond`, ticks nobody ran ("paused") and the pause itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from mega import Context, Schedule, Scheduler, load_config
from mega.runtime import boot, shutdown

KEY = "guide:every-second"


class EverySecond(Schedule):
    cron = "* * * * * *"  # six fields: every second
    timezone = "UTC"
    lock = {"lock": "main", "ttl": 5_000, "key": KEY}

    async def run(self, ctx: Context) -> None:
        await ctx.cache("main").native.incr(f"{KEY}:runs")


services = {
    "caches": {"main": {"driver": "redis", "url": os.environ.get("REDIS_URL", "")}},
    "locks": {"main": {"driver": "redlock", "caches": ["main"]}},
}
schedules = [EverySecond]


async def print_audit(at_least: int) -> None:
    ctx = await boot(load_config(__file__, signs=False), role="script", database=False)
    try:
        scheduler = Scheduler(ctx).register(EverySecond)
        rows = await scheduler.recent_ticks("EverySecond", limit=200)
        for row in rows:
            skipped = ", ".join(f"{s['instance']}: {s['reason']}" for s in row["skipped"])
            if row["winner"] is None:  # a tick nobody ran (paused), or a pause or a resume
                print(f"{row['instant']}  {row['source']}  {skipped}")
                continue
            print(f"{row['instant']}  winner {row['winner']}  fence {row['fence']}  "
                  f"skipped {skipped or '-'}")  # fmt: skip
        ticks = [row for row in rows if row["winner"]]
        runs = int(await ctx.cache("main").native.get(f"{KEY}:runs") or 0)
        print(f"{len(ticks)} instants, {runs} runs")
        assert runs == len(ticks), "an instant ran twice"
        if len(ticks) < at_least:  # nothing seen is no proof: say so, and fail
            sys.exit(
                f"only {len(ticks)} instant(s) ran, fewer than {at_least}: are the schedulers "
                f"running, on the Redis at REDIS_URL ({os.environ.get('REDIS_URL') or 'unset'})?"
            )
    finally:
        await shutdown(ctx)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The tick audit of EverySecond.")
    parser.add_argument("--at-least", type=int, default=1, help="fail with fewer instants run")
    asyncio.run(print_audit(parser.parse_args().at_least))
