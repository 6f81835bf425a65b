"""mega.testing: unit-test your own Schedules, Jobs and Listeners in milliseconds, no servers.

    from mega.testing import drain, failing, memory_context, planned_ticks, run_tick

    async def test_welcome_email_retries_then_succeeds() -> None:
        ctx = memory_context("jobs")                    # bus "jobs" in this process
        await JobQueue(ctx, "jobs").enqueue(SendWelcome, {"to": "ada@example.com"})
        with failing(SendWelcome, times=1):             # the first run raises
            report = await drain(ctx, jobs=[SendWelcome])
        assert report.count("SendWelcome", "retry") == 1
        assert report.count("SendWelcome", "done") == 1

    def test_the_report_runs_at_nine_in_seoul_across_dst() -> None:
        ticks = planned_ticks(DailyReport, datetime(2026, 3, 7, tzinfo=UTC), days=2)

- `memory_context(*buses)`: a Context whose buses are `memory` ones (jobs and events).
- `drain(ctx, jobs=..., listeners=...)`: runs everything enqueued or emitted, and everything
  that follows from it (retries, listener runs, jobs their listeners enqueue), until nothing is
  left; backoffs and delays are skipped, not slept. Returns the signals it saw.
- `failing(cls, times=n)`: the next n runs of a Job, Listener or Schedule class raise.
- `planned_ticks(cls, start, days=...)` and `run_tick(cls, ctx, instant)`: a schedule's planned
  instants from its cron and time zone (DST days included), and one run at a chosen instant
  with the Tick its run sees, without a scheduler or a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mega.context import BusAdapter, Context
from mega.events.listener import Listener
from mega.events.worker import ListenerWorker
from mega.jobs.job import Job
from mega.jobs.jobworker import JobWorker
from mega.jobs.memory import MemoryBroker
from mega.schedules import cron
from mega.schedules.schedule import Schedule, Tick

# drain() gives up after this many rounds without getting to the end (a job that enqueues
# itself forever, say), rather than spin.
MAX_ROUNDS = 10_000
SIGNALS = ("start", "done", "retry", "fail", "dlq")


def memory_context(*buses: str, instance_id: str = "test") -> Context:
    """A Context with a `memory` bus under each alias (default: "jobs")."""
    ctx = Context(instance_id=instance_id)
    for alias in buses or ("jobs",):
        broker: Any = MemoryBroker()
        ctx.buses[alias] = BusAdapter(alias, "memory://", broker, driver="memory")
    return ctx


@dataclass
class DrainReport:
    """What `drain` saw: every signal of the jobs and listeners it ran, in order."""

    signals: list[dict[str, Any]] = field(default_factory=list)

    def count(self, name: str, signal: str) -> int:
        """How many `signal`s ("start", "done", "retry", "fail", "dlq") of a job or group."""
        return sum(
            1
            for seen in self.signals
            if seen["signal"] == signal and name in (seen.get("job"), seen.get("group"))
        )

    @property
    def totals(self) -> Counter[str]:
        return Counter(seen["signal"] for seen in self.signals)


async def drain(
    ctx: Context, *, jobs: Iterable[type[Job]] = (), listeners: Iterable[type[Listener]] = ()
) -> DrainReport:
    """Run the given jobs and listener groups on the context's memory buses until nothing is
    ready, running or waiting; waiting retries and delayed jobs are made due at once."""
    report = DrainReport()
    job_worker, listener_worker = JobWorker(ctx), ListenerWorker(ctx)
    for job_cls in jobs:
        job_worker.register(job_cls)
    for listener_cls in listeners:
        listener_worker.register(listener_cls)
    for name in SIGNALS:
        job_worker.on(name, report.signals.append)
        listener_worker.on(name, report.signals.append)
    brokers = [bus.native for bus in ctx.buses.values() if isinstance(bus.native, MemoryBroker)]
    await listener_worker.start()
    await job_worker.start()
    try:
        for _ in range(MAX_ROUNDS):
            await _settle()
            if not any(broker.busy() for broker in brokers):
                break
            for broker in brokers:
                broker.fast_forward()
        else:
            raise RuntimeError(f"drain: still busy after {MAX_ROUNDS} rounds (a job loop?)")
    finally:
        await job_worker.stop(1)
        await listener_worker.stop(1)
    return report


async def _settle() -> None:
    """Let every runnable task of the loop run until none is left runnable."""
    for _ in range(20):
        await asyncio.sleep(0)


@contextlib.contextmanager
def failing(
    cls: type[Job] | type[Listener] | type[Schedule],
    *,
    times: int = 1,
    error: Exception | None = None,
) -> Iterator[None]:
    """The next `times` runs of `cls` raise `error` (default RuntimeError("injected failure"));
    the runs after those are the class's own."""
    original = cls.run
    left = [times]

    async def run(self: Any, *args: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise error or RuntimeError("injected failure")
        await original(self, *args)

    cls.run = run  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        cls.run = original  # type: ignore[method-assign]


def planned_ticks(
    schedule_cls: type[Schedule], start: datetime, *, days: float = 1, limit: int = 100_000
) -> list[datetime]:
    """The schedule's planned instants after `start` and within `days`, in its time zone."""
    end = start + timedelta(days=days)
    found: list[datetime] = []
    after = start
    while len(found) < limit:
        instant = cron.next(schedule_cls.cron, after, schedule_cls.timezone)
        if instant > end:
            break
        found.append(instant)
        after = instant
    return found


async def run_tick(
    schedule_cls: type[Schedule], ctx: Context, instant: datetime, *, fence: int | None = None
) -> Tick:
    """Run the schedule once as the scheduler would at `instant` (no lock, no audit); returns
    the Tick its run saw. Whatever the run raises is raised here."""
    tick = Tick(instant, fence, "schedule", ctx.instance_id)
    run_ctx = dataclasses.replace(ctx, extras={**ctx.extras, "tick": tick})  # as the scheduler
    await schedule_cls(tick).run(run_ctx)
    return tick
