"""mega.clock: the time mega decides by, and mega.testing's fake_clock, which drives it.

Under a FakeClock nothing waits for real time: a delayed job, a retry's backoff and a
schedule's instants happen when the test moves the clock, and not a moment before."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from mega import Context, Job, JobContext, JobQueue, JobStatus, Schedule
from mega import clock as mega_clock
from mega.clock import Clock, FakeClock
from mega.jobs.runner import JobRunner
from mega.schedules.scheduler import Scheduler
from mega.testing import fake_clock, memory_context

NOON = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
RUNS: Counter[str] = Counter()


class Reminder(Job):
    subject = "clock.reminder"
    bus = "jobs"

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        RUNS[payload["id"]] += 1


class Flaky(Job):
    """Fails its first run, then succeeds; a retry waits up to a minute (full jitter)."""

    subject = "clock.flaky"
    bus = "jobs"
    retries = 3
    backoff = {"type": "exponential", "initial": 60_000, "max": 60_000}

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        RUNS[payload["id"]] += 1
        if RUNS[payload["id"]] == 1:
            raise RuntimeError("the first run fails")


class EveryMinute(Schedule):
    cron = "0 * * * * *"  # second 0 of every minute
    timezone = "UTC"
    instants: list[datetime] = []

    async def run(self, ctx: Context) -> None:
        type(self).instants.append(self.tick.instant)


async def test_the_machine_clock_is_the_default_and_a_fake_one_only_within_its_block() -> None:
    assert type(mega_clock.current()) is Clock
    with fake_clock(NOON) as clock:
        assert mega_clock.current() is clock
        assert mega_clock.now() == NOON.timestamp()
        assert mega_clock.now_ms() == int(NOON.timestamp() * 1000)
        assert mega_clock.utcnow() == NOON
    assert type(mega_clock.current()) is Clock


async def test_a_fake_clock_stands_still_until_advanced_and_wakes_sleepers_in_order() -> None:
    clock = FakeClock(NOON)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.time() - NOON.timestamp()))

    tasks = [asyncio.create_task(sleeper(name, s)) for name, s in (("b", 20), ("a", 10))]
    await clock.advance(9.5)
    assert woke == [] and clock.pending() == 2
    await clock.advance(15)
    assert woke == [("a", 10.0), ("b", 20.0)]  # each at its own time, not at the end's
    assert clock.time() - NOON.timestamp() == 24.5
    await asyncio.gather(*tasks)


async def test_a_cancelled_timer_never_fires_and_a_wait_ends_on_its_event_or_its_time() -> None:
    clock = FakeClock(NOON)
    fired: list[str] = []
    timer = clock.call_later(5, lambda: fired.append("cancelled"))
    clock.call_later(5, lambda: fired.append("kept"))
    timer.cancel()
    await clock.advance(5)
    assert fired == ["kept"]

    event = asyncio.Event()
    timed_out = asyncio.create_task(clock.wait(event, 30))
    await clock.advance(29)
    assert not timed_out.done()
    await clock.advance(1)
    assert await timed_out is False

    answered = asyncio.create_task(clock.wait(event, 30))
    await clock.advance(0)
    event.set()
    assert await answered is True


async def test_a_fake_clock_only_moves_forward() -> None:
    with pytest.raises(ValueError, match="forward only"):
        await FakeClock(NOON).advance(-1)


async def worker_on(ctx: Context, *jobs: type[Job]) -> JobRunner:
    worker = JobRunner(ctx)
    for job in jobs:
        worker.register(job)
    await worker.start()
    return worker


async def test_a_delayed_job_runs_when_the_clock_reaches_its_time_and_not_before() -> None:
    with fake_clock(NOON) as clock:
        ctx = memory_context("jobs")
        worker = await worker_on(ctx, Reminder)
        queue = worker.queue("jobs")
        try:
            job_id = await queue.enqueue(Reminder, {"id": "in-an-hour"}, delay=3600)
            await clock.advance(3599)
            assert RUNS["in-an-hour"] == 0
            status = await queue.status(Reminder, job_id)
            assert status is not None and status.state == "delayed"
            assert status.due_at == int(NOON.timestamp() * 1000) + 3_600_000
            await clock.advance(1)
            await until(lambda: RUNS["in-an-hour"] == 1)
            await clock.advance(7200)
            assert RUNS["in-an-hour"] == 1  # once
        finally:
            await worker.stop(1)


async def test_a_retry_waits_its_backoff_on_the_clock() -> None:
    with fake_clock(NOON) as clock:
        ctx = memory_context("jobs")
        worker = await worker_on(ctx, Flaky)
        queue = worker.queue("jobs")
        try:
            job_id = await queue.enqueue(Flaky, {"id": "flaky"})
            retrying = await until_state(queue, job_id, "retrying")
            assert RUNS["flaky"] == 1 and retrying.due_at is not None
            wait_ms = retrying.due_at - mega_clock.now_ms()
            assert 0 <= wait_ms <= 60_000
            # The record's due_at and the clock's now are whole ms, the backoff is not: the
            # retry falls due within a millisecond either side of `wait_ms`.
            await clock.advance(max(wait_ms - 2, 0) / 1000)
            assert RUNS["flaky"] == 1  # its backoff has not passed
            await clock.advance(0.003)
            await until_state(queue, job_id, "done")
            assert RUNS["flaky"] == 2
        finally:
            await worker.stop(1)


async def test_a_schedule_ticks_once_per_instant_the_clock_passes() -> None:
    EveryMinute.instants = []
    with fake_clock(NOON.replace(second=30)) as clock:
        scheduler = Scheduler(memory_context("jobs")).register(EveryMinute)
        await scheduler.start()
        try:
            await clock.advance(29)
            assert EveryMinute.instants == []
            await clock.advance(3 * 60)  # 12:00:59 to 12:03:59
            minutes = [
                instant.astimezone(UTC).strftime("%H:%M:%S") for instant in EveryMinute.instants
            ]
            assert minutes == ["12:01:00", "12:02:00", "12:03:00"]
        finally:
            await scheduler.stop(1)


async def until(check: Any, rounds: int = 1000) -> None:
    """Let the loop run (no time passes on the fake clock) until `check()` holds."""
    for _ in range(rounds):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("the loop went quiet before it held")


async def until_state(queue: JobQueue, job_id: str, state: str) -> JobStatus:
    """Let the loop run until the job's status record is in `state`; the record."""
    for _ in range(1000):
        status = await queue.status(Flaky, job_id)
        if status is not None and status.state == state:
            return status
        await asyncio.sleep(0)
    raise AssertionError(f"{job_id} never reached {state}")
