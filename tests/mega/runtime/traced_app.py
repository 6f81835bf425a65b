"""A schedule that enqueues a job each second, for the test of a traced `mega work` host."""

from __future__ import annotations

from typing import Any

from mega import Context, Job, Schedule


class Echo(Job):
    subject = "traced.echo"
    bus = "jobs"

    async def run(self, payload: Any, ctx: Context) -> Any:
        return payload


class EnqueueEverySecond(Schedule):
    cron = "* * * * * *"
    timezone = "UTC"

    async def run(self, ctx: Context) -> None:
        await Echo.enqueue(ctx, {"tick": self.tick.instant.isoformat()})
