"""CronCounterSchedule without a scheduler: ticks at instants we choose, Redis in memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

from app.schedules.cron_counter import CronCounterSchedule
from app.services.cron_counter import read_state
from mega.testing import memory_context, planned_ticks, run_tick

NOON = datetime(2026, 3, 8, 3, 0, tzinfo=UTC)  # noon in Seoul, on the US's DST day


async def test_a_tick_adds_one_and_appends_its_run_to_the_history() -> None:
    ctx = memory_context(caches=["main"])
    await run_tick(CronCounterSchedule, ctx, NOON, fence=7)
    await run_tick(CronCounterSchedule, ctx, NOON + timedelta(seconds=30), fence=8)
    state = await read_state(ctx.cache("main").native)
    assert state["count"] == 2
    assert state["history"] == [  # newest first
        {"at": "2026-03-08T03:00:30+00:00", "source": "schedule", "fence": 8},
        {"at": "2026-03-08T03:00:00+00:00", "source": "schedule", "fence": 7},
    ]


async def test_a_stale_fence_changes_nothing() -> None:
    ctx = memory_context(caches=["main"])
    await run_tick(CronCounterSchedule, ctx, NOON, fence=8)
    await run_tick(CronCounterSchedule, ctx, NOON - timedelta(seconds=30), fence=7)  # woke late
    assert (await read_state(ctx.cache("main").native))["count"] == 1


def test_it_runs_every_30_seconds_and_seoul_has_no_dst() -> None:
    europe_springs_forward = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    start = europe_springs_forward - timedelta(minutes=30)
    hour = planned_ticks(CronCounterSchedule, start, days=1 / 24)
    assert len(hour) == 120 and hour[0] == start + timedelta(seconds=30)
    assert {later - earlier for earlier, later in pairwise(hour)} == {timedelta(seconds=30)}
    assert {tick.utcoffset() for tick in hour} == {timedelta(hours=9)}  # +09:00 all year
