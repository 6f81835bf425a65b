"""Pausing a schedule across a cluster (mega.schedules.pause + the Scheduler), on a real Redis."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from mega.drivers.redis.client import RedisClient
from mega.errors import ConfigError
from mega.schedules.pause import SchedulePause
from mega.schedules.scheduler import Scheduler
from tests.mega.schedules.test_scheduler import Run, context, fire_at, schedule, wait_for


async def test_a_paused_schedule_is_skipped_on_every_instance_until_resumed(
    lock_clients: Callable[[], Awaitable[RedisClient]], prefix: str
) -> None:
    runs: list[Run] = []
    probe = schedule(f"{{{prefix}}}", runs)  # every second; tagged for a Redis Cluster
    a = Scheduler(context("a", await lock_clients())).register(probe)
    b = Scheduler(context("b", await lock_clients())).register(probe)
    # What the CLI and the web app do: a Scheduler of their own, never started.
    ops = Scheduler(context("ops", await lock_clients())).register(probe)
    skips: list[dict[str, Any]] = []
    a.on("skip", skips.append)
    b.on("skip", skips.append)
    await a.start()
    await b.start()
    try:
        await wait_for(lambda: len(runs) >= 1, timeout_s=5)
        pause = await ops.pause("Probe", by="ada")
        paused_at = time.time()
        assert pause.paused is True and pause.by == "ada"
        assert await a.paused("Probe") == pause

        def paused_ticks() -> set[str]:
            return {s["instance"] for s in skips if s["reason"] == "paused"}

        await wait_for(lambda: paused_ticks() == {"a", "b"} and len(skips) >= 4, timeout_s=5)
        resume = await ops.resume("Probe", by="grace")
        resumed_at = time.time()
        assert await b.paused("Probe") == SchedulePause(False, resume.at_ms, "grace")
        ran_before = len(runs)
        await wait_for(lambda: len(runs) > ran_before, timeout_s=5)
    finally:
        await a.stop()
        await b.stop()

    # No planned tick after the pause ran until the resume; the first one after it ran.
    during = [r for r in runs if paused_at < r[0].timestamp() < resumed_at]
    assert during == []
    first_after = min(r[0] for r in runs if r[0].timestamp() > resumed_at)
    assert first_after == datetime.fromtimestamp(math.ceil(resumed_at), UTC)
    assert all(s["source"] == "schedule" for s in skips if s["reason"] == "paused")

    ticks = await a.recent_ticks("Probe", limit=100)
    changes = [t for t in ticks if t["source"] in ("pause", "resume")]
    assert [(t["source"], t["winner"], t["skipped"]) for t in changes] == [
        ("resume", None, [{"instance": "ops", "reason": "resumed by grace"}]),
        ("pause", None, [{"instance": "ops", "reason": "paused by ada"}]),
    ]
    assert pause.at_ms is not None
    assert datetime.fromisoformat(changes[1]["instant"]).timestamp() == pytest.approx(
        pause.at_ms / 1000, abs=0.01
    )
    held = [
        sorted((s["instance"], s["reason"]) for s in t["skipped"])
        for t in ticks
        if t["source"] == "schedule"
        and t["winner"] is None
        and paused_at < datetime.fromisoformat(t["instant"]).timestamp() < resumed_at
    ]
    # Every instance skipped each tick of the pause, for the pause. On a machine loaded enough
    # that the pause record's read outlasts its timeout, an instance ticks as if not paused
    # (`Ticks.read_pauses`), and its claim, on the same slow server, may fail too: a lock
    # backend error, never a run (`during` above).
    assert [("a", "paused"), ("b", "paused")] in held, f"no tick paused on both: {held}"
    for skipped in held:
        assert {instance for instance, _ in skipped} <= {"a", "b"}, skipped
        assert all(
            reason == "paused" or reason.startswith("lock backend error: ") for _, reason in skipped
        ), skipped


async def test_a_manual_tick_runs_while_the_schedule_is_paused(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(schedule(prefix, runs))
    await scheduler.pause("Probe", by="ada")
    planned = await fire_at(scheduler, "Probe", datetime.now(UTC))
    assert (planned.ran, planned.reason) == (False, "paused")
    manual = await scheduler.run_now("Probe")
    assert manual.ran is True and [r[3] for r in runs] == ["manual"]


async def test_a_schedule_without_a_lock_cannot_be_paused(
    redis_url: str, clients: Callable[[str], Redis]
) -> None:
    scheduler = Scheduler(context("a", clients(redis_url))).register(schedule(None, []))
    with pytest.raises(ConfigError) as caught:
        await scheduler.pause("Probe", by="ada")
    assert caught.value.code == "schedule.no_lock"
    assert caught.value.message.startswith("schedule 'Probe' has no lock, so it cannot be paused")
    assert 'lock such as {"lock": "main", "ttl": 20000}' in caught.value.message
    assert await scheduler.paused("Probe") == SchedulePause(False)


async def test_an_unreadable_pause_record_is_no_pause_and_is_logged_once(
    redis_url: str, clients: Callable[[str], Redis], prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[Run] = []
    client = clients(redis_url)
    scheduler = Scheduler(context("a", client)).register(schedule(prefix, runs))
    await client.set(f"{prefix}:paused", "not json")
    with caplog.at_level(logging.WARNING, logger="mega.scheduler"):
        for seconds_ago in (2, 1):  # two instants, two claims
            planned = datetime.now(UTC) - timedelta(seconds=seconds_ago)
            assert (await fire_at(scheduler, "Probe", planned)).ran is True
    warnings = [r.message for r in caplog.records if "pause record" in r.message]
    assert len(warnings) == 1 and "ticking as if not paused" in warnings[0]
    assert len(runs) == 2
