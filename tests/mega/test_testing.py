"""mega.testing, the kit users unit-test their own classes with: no servers, no real sleeps."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from mega import (
    Context,
    Event,
    EventBus,
    Job,
    JobContext,
    JobQueue,
    Listener,
    ReceivedEvent,
    Schedule,
    Worker,
)
from mega.errors import RegistrationError
from mega.testing import (
    drain,
    failing,
    failing_dlq,
    kill_child,
    memory_context,
    planned_ticks,
    run_tick,
    worker_pool,
)

RAN: list[tuple[str, Any]] = []


class Welcome(Job):
    subject = "kit.welcome"
    bus = "jobs"
    retries = 2
    backoff = {"type": "exponential", "initial": 60_000, "max": 60_000}  # a minute: never slept

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        RAN.append(("welcome", payload["to"]))
        if payload.get("bounce"):
            raise RuntimeError(f"{payload['to']} bounced")


class Export(Job):
    subject = "kit.export"
    bus = "jobs"

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        for part in (1, 2):
            await ctx.progress(part / 2, f"part {part} of 2")


class SignedUp(Event):
    name = "kit.signed_up"
    bus = "jobs"


class SendWelcome(Listener):
    event = SignedUp

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        await JobQueue(ctx, "jobs").enqueue(Welcome, {"to": event.data["email"]})


class DailyReport(Schedule):
    cron = "0 0 9 * * *"
    timezone = "Europe/Berlin"

    async def run(self, ctx: Context) -> None:
        RAN.append(("report", self.tick.instant))


class KitTasks(Worker):
    name = "kit"
    task_file = "tests/mega/workers/worker_tasks.py"
    pool_size = 8  # worker_pool starts one slot, whatever the class says


@pytest.fixture(autouse=True)
def clean() -> None:
    RAN.clear()


async def test_drain_runs_retries_and_the_dlq_without_sleeping() -> None:
    ctx = memory_context("jobs")
    queue = JobQueue(ctx, "jobs")
    await queue.enqueue(Welcome, {"to": "ok@example.com"})
    await queue.enqueue(Welcome, {"to": "gone@example.com", "bounce": True})
    await queue.enqueue(Welcome, {"to": "later@example.com"}, delay=3600)
    started = time.monotonic()
    report = await drain(ctx, jobs=[Welcome])
    assert time.monotonic() - started < 5  # two minutes of backoff and an hour of delay skipped
    assert report.count("Welcome", "done") == 2
    assert report.count("Welcome", "retry") == 2 and report.count("Welcome", "dlq") == 1
    [record] = await queue.dlq.list(Welcome)
    assert (record["payload"]["to"], record["attempts"]) == ("gone@example.com", 3)
    assert sorted(to for _, to in RAN) == ["gone@example.com"] * 3 + [
        "later@example.com",
        "ok@example.com",
    ]


async def test_failing_injects_failures_then_lets_the_class_run() -> None:
    ctx = memory_context()
    await JobQueue(ctx, "jobs").enqueue(Welcome, {"to": "flaky@example.com"})
    with failing(Welcome, times=1):
        report = await drain(ctx, jobs=[Welcome])
    assert [s["signal"] for s in report.signals] == ["start", "retry", "start", "done"]
    assert RAN == [("welcome", "flaky@example.com")]  # the injected failure never ran the body
    assert Welcome.run.__qualname__ == "Welcome.run"  # restored


class Tally(Job):
    """A plain `def run`: it runs on a thread."""

    subject = "kit.tally"
    bus = "jobs"

    def run(self, payload: dict[str, Any], ctx: Context) -> None:
        RAN.append(("tally", threading.current_thread() is threading.main_thread()))


class CountSignups(Listener):
    event = SignedUp

    def run(self, event: ReceivedEvent, ctx: Context) -> None:
        RAN.append(("signup", event.data["email"]))


async def test_plain_def_runs_on_a_thread_and_failing_keeps_them_plain() -> None:
    ctx = memory_context()
    await Tally.enqueue(ctx, {})
    await EventBus(ctx, "jobs").emit(SignedUp, {"email": "ada@example.com"})
    with failing(Tally, times=1), failing(CountSignups, times=1):
        report = await drain(ctx, jobs=[Tally], listeners=[CountSignups])
    assert report.count("Tally", "retry") == 1 and report.count("Tally", "done") == 1
    assert report.count("CountSignups", "retry") == 1
    assert report.count("CountSignups", "done") == 1
    assert sorted(RAN) == [("signup", "ada@example.com"), ("tally", False)]


async def test_a_failed_dlq_publish_keeps_the_job_until_its_record_is_written() -> None:
    ctx = memory_context()
    queue = JobQueue(ctx, "jobs")
    await queue.enqueue(Welcome, {"to": "gone@example.com", "bounce": True})
    with failing_dlq(times=2):
        report = await drain(ctx, jobs=[Welcome])
    publishes = [s for s in report.signals if s.get("phase") == "dlq_publish"]
    assert [s["error_type"] for s in publishes] == ["ConnectionError", "ConnectionError"]
    assert report.count("Welcome", "dlq") == 1 and report.count("Welcome", "start") == 3
    assert len(RAN) == 3  # the retried writes did not run the job again
    [record] = await queue.dlq.list(Welcome)
    assert (record["id"], record["attempts"]) == (report.signals[0]["id"], 3)
    assert (await queue.stats(Welcome)).pending == 0


async def test_drain_records_a_jobs_progress_reports() -> None:
    ctx = memory_context()
    await JobQueue(ctx, "jobs").enqueue(Export, {})
    report = await drain(ctx, jobs=[Export])
    assert [(s["fraction"], s["note"]) for s in report.signals if s["signal"] == "progress"] == [
        (0.5, "part 1 of 2"),
        (1.0, "part 2 of 2"),
    ]
    assert report.count("Export", "progress") == 2


async def test_an_event_runs_its_listener_and_the_job_it_enqueues() -> None:
    ctx = memory_context("jobs")
    await EventBus(ctx, "jobs").emit(SignedUp, {"email": "ada@example.com"})
    report = await drain(ctx, jobs=[Welcome], listeners=[SendWelcome])
    assert report.count("SendWelcome", "done") == 1 and report.count("Welcome", "done") == 1
    assert RAN == [("welcome", "ada@example.com")]


def test_planned_ticks_follow_the_time_zone_across_a_dst_change() -> None:
    ticks = planned_ticks(DailyReport, datetime(2026, 3, 27, tzinfo=UTC), days=4)
    berlin = [tick.astimezone(ZoneInfo("Europe/Berlin")).hour for tick in ticks]
    utc = [tick.astimezone(UTC).hour for tick in ticks]
    assert berlin == [9, 9, 9, 9] and utc == [8, 8, 7, 7]  # summer time from March 29


async def test_run_tick_runs_one_instant_with_its_tick() -> None:
    instant = datetime(2026, 3, 30, 7, tzinfo=UTC)
    tick = await run_tick(DailyReport, memory_context(), instant, fence=42)
    assert [("report", instant)] == RAN and (tick.instant, tick.fence) == (instant, 42)
    with failing(DailyReport, error=ValueError("no data")), pytest.raises(ValueError):
        await run_tick(DailyReport, memory_context(), instant + timedelta(days=1))


class EveryMinuteSixtyOne(DailyReport):
    cron = "61 * * * *"  # `mega scheduler` refuses it: minutes go to 59


class LockedReport(DailyReport):
    lock = {"lock": "main", "ttl": 5_000}  # no lock is taken by run_tick: none is declared


async def test_run_tick_and_planned_ticks_refuse_what_the_scheduler_refuses() -> None:
    start = datetime(2026, 3, 30, tzinfo=UTC)
    with pytest.raises(RegistrationError, match="cron: invalid cron expression '61 "):
        await run_tick(EveryMinuteSixtyOne, memory_context(), start)
    with pytest.raises(RegistrationError, match="schedule 'EveryMinuteSixtyOne' is invalid"):
        planned_ticks(EveryMinuteSixtyOne, start)
    assert not RAN
    await run_tick(LockedReport, memory_context(), start)
    assert [("report", start)] == RAN


async def test_each_memory_context_has_its_own_in_memory_redis() -> None:
    first, second = memory_context(caches=["main"]), memory_context(caches=["main"])
    redis = first.cache("main").native
    assert await redis.eval("return redis.call('INCR', KEYS[1])", 1, "runs") == 1  # Lua too
    assert await redis.get("runs") == "1"  # str, as the hosts' clients decode
    assert await second.cache("main").native.get("runs") is None


async def test_drain_runs_the_apps_hooks_and_leaves_other_queues_alone() -> None:
    ctx = memory_context("jobs")
    await EventBus(ctx, "jobs").emit(SignedUp, {"email": "ada@example.com"})
    seen: list[str] = []

    def attach(worker: Any, hook_ctx: Context) -> None:
        assert hook_ctx is ctx
        worker.on("done", lambda signal: seen.append(signal["group"]))

    report = await drain(ctx, listeners=[SendWelcome], hooks={"listeners": [attach]})
    assert seen == ["SendWelcome"] and report.count("SendWelcome", "done") == 1
    assert (await JobQueue(ctx, "jobs").stats(Welcome)).pending == 1  # not drained: queued
    assert not RAN
    with pytest.raises(ValueError, match="scheduler"):
        await drain(ctx, jobs=[Welcome], hooks={"scheduler": [attach]})


async def test_worker_pool_runs_a_workers_tasks_as_ctx_workers() -> None:
    ctx = memory_context()
    async with worker_pool(KitTasks, ctx, mode="thread") as pool:
        assert await ctx.workers["kit"].run("add", {"a": 2, "b": 3}) == 5
        assert await pool.run("pid") == os.getpid()  # thread mode: in this process
        assert pool.stats()["size"] == 1
        with pytest.raises(ValueError, match="no child process to kill"):
            kill_child(pool)
    assert ctx.workers == {}  # stopped and gone at the end of the block
