"""CronCounterSchedule: every 30 seconds (Asia/Seoul), once across the whole cluster.

Run two `mega scheduler` processes: each tick still counts once, and /demo/cron shows which
instance won each tick and why the other skipped.
"""

from __future__ import annotations

from app.services.cron_counter import record_run
from mega import Context, Schedule


class CronCounterSchedule(Schedule):
    cron = "*/30 * * * * *"  # six fields: the first is seconds
    timezone = "Asia/Seoul"
    # ttl bounds the overlap guard: a run that dies holding it blocks ticks for at most 20 s,
    # less than the 30 s period. See docs/guide/schedules.md on choosing a TTL.
    lock = {"lock": "main", "ttl": 20_000}

    async def run(self, ctx: Context) -> None:
        await record_run(
            ctx.cache("main").native,
            at=self.tick.instant,
            source=self.tick.source,
            fence=self.tick.fence,
        )
