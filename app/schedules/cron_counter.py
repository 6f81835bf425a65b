"""CronCounterSchedule: every 30 seconds (Asia/Seoul), once across the whole cluster.

Run two `mega scheduler` processes (`mega dev` does): each tick still counts once, and
/demo/cron shows which instance won each tick and why the other skipped ("claimed by another
instance"). A manual tick can ask to hold its run (`hold_ms` in the run's `ctx.extras`): while
it holds, the overlap guard stays held too, and the next tick is skipped: the scheduler that
claimed it records "overlap", the other "claimed by another instance" (it lost the claim).
"""

from __future__ import annotations

import asyncio
import os

from app.services.cron_counter import HOLD_EXTRA, HOLD_STARTED_EXTRA, record_run
from mega import Context, Schedule


class CronCounterSchedule(Schedule):
    # Six fields: the first is seconds. MEGA_DEMO_CRON sets another (the browser tests tick
    # every 5 s, so a test that waits for the next tick waits seconds, not half a minute).
    cron = os.environ.get("MEGA_DEMO_CRON") or "*/30 * * * * *"
    timezone = "Asia/Seoul"
    # ttl bounds the overlap guard: a run that dies holding it blocks ticks for at most 20 s,
    # less than the 30 s period. A run that lives keeps it (the scheduler renews it every
    # third of the ttl), however long it takes. See docs/guide/schedules.md on choosing a TTL.
    lock = {"lock": "main", "ttl": 20_000}

    async def run(self, ctx: Context) -> None:
        await record_run(
            ctx.cache("main").native,
            at=self.tick.instant,
            source=self.tick.source,
            fence=self.tick.fence,
        )
        hold_ms = ctx.extras.get(HOLD_EXTRA, 0)
        if self.tick.source == "manual" and hold_ms:
            # Counted first (the page shows the run at once), then kept going: the guard is
            # held for the whole hold, so a tick that falls inside it is skipped.
            started: asyncio.Event | None = ctx.extras.get(HOLD_STARTED_EXTRA)
            if started is not None:
                started.set()
            await asyncio.sleep(hold_ms / 1000)
