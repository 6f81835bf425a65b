"""Dynamic entries of a Schedule class (mega.schedules.dynamic + the Scheduler), on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from mega.context import Context
from mega.drivers.embedded import EmbeddedServer
from mega.drivers.redis.client import RedisClient
from mega.errors import ConfigError, RegistrationError
from mega.schedules.dynamic import ScheduleEntry, changes, validate_entry
from mega.schedules.schedule import Schedule
from mega.schedules.scheduler import Scheduler
from mega.testing import planned_ticks, run_tick
from tests.mega.schedules.test_scheduler import context, schedule, wait_for

# A run of a tenant schedule: its entry's key (None: the class's own cron), args, instant, instance.
TenantRun = tuple[str | None, dict[str, Any], datetime, str]


def tenant_schedule(prefix: str, runs: list[TenantRun], *, expr: str = "0 3 * * *") -> type:
    class TenantReport(Schedule):
        cron = expr
        timezone = "UTC"
        lock = {"lock": "main", "ttl": 5_000, "key": prefix}

        async def run(self, ctx: Context) -> None:
            runs.append((self.key, self.args, self.tick.instant, self.tick.instance_id))

    return TenantReport


def entry(key: str, expr: str = "* * * * * *", **args: Any) -> ScheduleEntry:
    return ScheduleEntry(key, expr, "UTC", args)


# -- pure -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "stored", "stop", "start"),
    [
        ({}, {"a": entry("a")}, [], ["a"]),
        ({"a": entry("a")}, {"a": entry("a")}, [], []),
        ({"a": entry("a")}, {}, ["a"], []),
        ({"a": entry("a")}, {"a": entry("a", "*/2 * * * * *")}, ["a"], ["a"]),
        ({"a": entry("a")}, {"a": entry("a", region="eu")}, ["a"], ["a"]),
        # Who wrote it and when do not restart a loop.
        ({"a": entry("a")}, {"a": ScheduleEntry("a", "* * * * * *", "UTC", {}, 5, "ada")}, [], []),
        ({"a": entry("a"), "b": entry("b")}, {"b": entry("b"), "c": entry("c")}, ["a"], ["c"]),
    ],
)
def test_changes_stop_and_start_what_differs(
    running: dict[str, ScheduleEntry],
    stored: dict[str, ScheduleEntry],
    stop: list[str],
    start: list[str],
) -> None:
    stopped, started = changes(running, stored)
    assert (stopped, [e.key for e in started]) == (stop, start)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"key": ""}, "key: must be 1 to 128 letters"),
        ({"key": "a b"}, "key: must be 1 to 128 letters"),
        ({"key": "x" * 129}, "key: must be 1 to 128 letters"),
        ({"cron": "* * *"}, "cron: cron expression '* * *' has 3 fields"),
        ({"cron": "0 0 31 2 *"}, "cron: cron expression '0 0 31 2 *' never fires"),
        ({"timezone": "Mars/Base"}, "timezone: unknown time zone 'Mars/Base'"),
        ({"args": [1, 2]}, "args: must be a JSON object"),
        ({"args": {"at": datetime(2024, 1, 1)}}, "args: must hold JSON values only"),
    ],
)
def test_each_bad_field_is_named(fields: dict[str, Any], problem: str) -> None:
    given = {"key": "acme", "cron": "* * * * *", "timezone": "UTC", "args": {}, **fields}
    with pytest.raises(ConfigError) as caught:
        validate_entry(
            "TenantReport", given["key"], given["cron"], given["timezone"], given["args"]
        )
    assert caught.value.code == "schedule.entry_invalid"
    assert caught.value.message.startswith(
        f"entry {given['key']!r} of schedule 'TenantReport' is invalid: "
    )
    assert problem in caught.value.message


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_entry("TenantReport", "acme", "nope", "Mars/Base", "[]")
    message = caught.value.message
    assert "cron: " in message and "timezone: " in message and "args: " in message


# -- against Redis, the Scheduler not started -------------------------------------------------


async def test_add_change_remove_and_list_with_the_audit(
    lock_clients: Callable[[], Awaitable[RedisClient]], prefix: str
) -> None:
    tenant = tenant_schedule(f"{{{prefix}}}", [])  # tagged for a Redis Cluster
    ops = Scheduler(context("ops", await lock_clients())).register(tenant)
    assert await ops.entries("TenantReport") == []

    added = await ops.add(
        "TenantReport",
        key="acme",
        cron="0 6 * * *",
        timezone="Europe/Paris",
        args={"tenant": "acme", "pages": [1, 2]},
        by="ada",
    )
    await ops.add("TenantReport", key="globex", cron="*/5 * * * *", by="ada")
    changed = await ops.add(
        "TenantReport", key="acme", cron="*/2 * * * * *", args={"tenant": "acme"}, by="grace"
    )
    assert added.at_ms <= changed.at_ms and changed.by == "grace"
    listed = await ops.entries("TenantReport")
    assert [(e.key, e.cron, e.timezone, e.args, e.by) for e in listed] == [
        ("acme", "*/2 * * * * *", None, {"tenant": "acme"}, "grace"),
        ("globex", "*/5 * * * *", None, {}, "ada"),
    ]
    removed = await ops.remove("TenantReport", key="globex", by="grace")
    assert removed is not None and removed.cron == "*/5 * * * *"
    assert [e.key for e in await ops.entries("TenantReport")] == ["acme"]

    ticks = await ops.recent_ticks("TenantReport", limit=10)
    assert [(t["source"], t["key"], t["winner"], t["skipped"]) for t in ticks] == [
        ("remove", "globex", None, [{"instance": "ops", "reason": "removed by grace"}]),
        (
            "change",
            "acme",
            None,
            [{"instance": "ops", "reason": "changed by grace: '*/2 * * * * *' in the class zone"}],
        ),
        (
            "add",
            "globex",
            None,
            [{"instance": "ops", "reason": "added by ada: '*/5 * * * *' in the class zone"}],
        ),
        (
            "add",
            "acme",
            None,
            [{"instance": "ops", "reason": "added by ada: '0 6 * * *' in Europe/Paris"}],
        ),
    ]


async def test_removing_an_absent_key_writes_nothing(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    client = clients(redis_url)
    ops = Scheduler(context("ops", client)).register(tenant_schedule(prefix, []))
    assert await ops.remove("TenantReport", key="nobody", by="ada") is None
    assert await client.keys(f"{prefix}:*") == []


async def test_bad_input_changes_nothing(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    client = clients(redis_url)
    ops = Scheduler(context("ops", client)).register(tenant_schedule(prefix, []))
    await ops.add("TenantReport", key="acme", cron="* * * * *", by="ada")
    before = {key: await client.dump(key) for key in await client.keys(f"{prefix}:*")}
    bad: list[dict[str, Any]] = [
        {"cron": "61 * * * *"},
        {"timezone": "Nowhere/City"},
        {"args": ["not", "an", "object"]},
        {"key": "has space"},
    ]
    for fields in bad:
        given = {"key": "acme", "cron": "*/5 * * * *", **fields}
        with pytest.raises(ConfigError) as caught:
            await ops.add("TenantReport", **given)
        assert caught.value.code == "schedule.entry_invalid"
    after = {key: await client.dump(key) for key in await client.keys(f"{prefix}:*")}
    assert after == before
    with pytest.raises(ValueError, match="no schedule named 'Nightly'"):
        await ops.add("Nightly", key="acme", cron="* * * * *")


async def test_a_schedule_without_a_lock_has_no_entries(
    redis_url: str, clients: Callable[[str], Redis]
) -> None:
    scheduler = Scheduler(context("a", clients(redis_url))).register(schedule(None, []))
    for change in (
        scheduler.add("Probe", key="acme", cron="* * * * *"),
        scheduler.remove("Probe", key="acme"),
    ):
        with pytest.raises(ConfigError) as caught:
            await change
        assert caught.value.code == "schedule.no_lock"
        assert caught.value.message.startswith(
            "schedule 'Probe' has no lock, so it cannot have dynamic entries"
        )
    assert await scheduler.entries("Probe") == []


async def test_an_unreadable_entry_is_left_out_and_can_be_removed(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    client = clients(redis_url)
    ops = Scheduler(context("ops", client)).register(tenant_schedule(prefix, []))
    await ops.add("TenantReport", key="acme", cron="* * * * *")
    await client.hset(f"{prefix}:entries", "broken", '{"cron": "every day"}')
    assert [e.key for e in await ops.entries("TenantReport")] == ["acme"]
    removed = await ops.remove("TenantReport", key="broken")
    assert removed is not None and removed.cron == "?"
    assert await client.hkeys(f"{prefix}:entries") == [b"acme"]


# -- two started schedulers -------------------------------------------------------------------


async def test_two_schedulers_run_each_entry_tick_once_follow_a_change_and_a_remove(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[TenantRun] = []
    tenant = tenant_schedule(prefix, runs, expr="* * * * * *")
    a = Scheduler(context("a", clients(redis_url))).register(tenant)
    b = Scheduler(context("b", clients(redis_url))).register(tenant)
    ops = Scheduler(context("ops", clients(redis_url))).register(tenant)
    signals: list[dict[str, Any]] = []
    a.on("run", signals.append)
    b.on("run", signals.append)
    await a.start()
    await b.start()

    def of(key: str | None) -> list[TenantRun]:
        return [r for r in runs if r[0] == key]

    try:
        await ops.add("TenantReport", key="acme", cron="* * * * * *", args={"n": 1}, by="ada")
        added_at = time.time()
        await wait_for(lambda: len(of("acme")) >= 4, timeout_s=10)
        # Within about a second of the add: the poll, then the next instant.
        first = min(r[2].timestamp() for r in of("acme"))
        assert first - added_at < 2.5

        await ops.add("TenantReport", key="acme", cron="*/2 * * * * *", args={"n": 2}, by="ada")
        changed_at = time.time()
        await wait_for(lambda: sum(1 for r in of("acme") if r[1] == {"n": 2}) >= 3, timeout_s=10)

        await ops.remove("TenantReport", key="acme", by="ada")
        removed_at = time.time()
        static_before = len(of(None))
        # Past the poll and a tick that may already have been claimed, nothing more of acme.
        await wait_for(lambda: len(of(None)) >= static_before + 4, timeout_s=10)
    finally:
        await a.stop()
        await b.stop()

    per_instant = Counter((r[0], r[2]) for r in runs)
    assert set(per_instant.values()) == {1}, f"an instant ran twice: {per_instant}"
    acme = of("acme")
    # The new cron from about a second after the change: even seconds only, new args.
    new = [r for r in acme if r[2].timestamp() > changed_at + 1.5]
    assert new and all(r[2].second % 2 == 0 and r[1] == {"n": 2} for r in new)
    assert all(r[1] == {"n": 1} for r in acme if r[2].timestamp() < changed_at)
    assert max(r[2].timestamp() for r in acme) < removed_at + 1.5
    assert len(of(None)) >= 4  # the class's own cron ran all along
    keyed = [s for s in signals if s["key"] == "acme"]
    assert len(keyed) == len(acme) and {s["schedule"] for s in keyed} == {"TenantReport"}

    ticks = await ops.recent_ticks("TenantReport", limit=200)
    ran = [t for t in ticks if t["key"] == "acme" and t["source"] == "schedule"]
    assert ran and all(t["winner"] in ("a", "b") for t in ran)
    # The other instance skipped each: claimed by the winner (or, on a loaded machine, woken
    # too late to try), never a second run.
    assert all({s["instance"] for s in t["skipped"]} <= {"a", "b"} - {t["winner"]} for t in ran)
    reasons = [s["reason"] for t in ran for s in t["skipped"]]
    assert reasons.count("claimed by another instance") >= len(ran) // 2, reasons


async def test_a_paused_class_skips_its_entries_too(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[TenantRun] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(tenant_schedule(prefix, runs))
    skips: list[dict[str, Any]] = []
    scheduler.on("skip", skips.append)
    await scheduler.pause("TenantReport", by="ada")
    await scheduler.add("TenantReport", key="acme", cron="* * * * * *")
    await scheduler.start()
    try:
        await wait_for(lambda: len([s for s in skips if s["key"] == "acme"]) >= 2, timeout_s=10)
    finally:
        await scheduler.stop()
    assert runs == []
    assert {(s["key"], s["reason"]) for s in skips} == {("acme", "paused")}


async def test_an_entry_added_before_start_ticks_and_a_stop_ends_its_loop(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[TenantRun] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(tenant_schedule(prefix, runs))
    await scheduler.add("TenantReport", key="acme", cron="* * * * * *", args={"x": True})
    await scheduler.start()
    try:
        await wait_for(lambda: len(runs) >= 2, timeout_s=10)
    finally:
        await scheduler.stop()
    count = len(runs)
    # The stop ended every loop it started: the class's, the watch and the entry's.
    assert all(task.done() for task in asyncio.all_tasks() if "mega.schedule" in task.get_name())
    assert len(runs) == count and {(r[0], str(r[1])) for r in runs} == {("acme", "{'x': True}")}


# -- a class of entries only (cron = None) ----------------------------------------------------


def entries_only(prefix: str | None, runs: list[TenantRun]) -> type[Schedule]:
    class TenantOnly(Schedule):
        cron = None
        timezone = "UTC"
        lock = None if prefix is None else {"lock": "main", "ttl": 5_000, "key": prefix}

        async def run(self, ctx: Context) -> None:
            runs.append((self.key, self.args, self.tick.instant, self.tick.instance_id))

    return TenantOnly


async def test_a_class_with_cron_none_ticks_only_its_entries(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[TenantRun] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(entries_only(prefix, runs))
    described = scheduler.describe("TenantOnly")
    assert (described["cron"], described["next_runs"]) == (None, [])
    assert planned_ticks(entries_only(prefix, runs), datetime.now(UTC)) == []
    await scheduler.add("TenantOnly", key="acme", cron="* * * * * *", args={"n": 1})
    await scheduler.start()
    try:
        await wait_for(lambda: len(runs) >= 3, timeout_s=10)
    finally:
        await scheduler.stop()
    assert {(key, str(args)) for key, args, *_ in runs} == {("acme", "{'n': 1}")}


def test_cron_none_needs_a_lock_and_a_forgotten_cron_is_still_missing(redis_url: str) -> None:
    scheduler = Scheduler(context("a", Redis.from_url(redis_url)))
    with pytest.raises(RegistrationError) as caught:
        scheduler.register(entries_only(None, []))
    assert caught.value.message == (
        "schedule 'TenantOnly' is invalid: lock: required with cron = None: the class then runs "
        "through its dynamic entries only, which are kept in the Redis of its lock; set e.g. "
        'lock = {"lock": "main", "ttl": 20000}'
    )

    class Forgotten(Schedule):
        timezone = "UTC"

        async def run(self, ctx: Context) -> None: ...

    with pytest.raises(RegistrationError, match=r'cron: missing; set e\.g\. cron = "'):
        scheduler.register(Forgotten)


async def test_run_tick_runs_a_tick_of_an_entry() -> None:
    runs: list[TenantRun] = []
    tick = await run_tick(
        entries_only("unused", runs),
        Context(instance_id="t"),
        datetime(2024, 1, 1, tzinfo=UTC),
        key="acme",
        args={"n": 2},
    )
    assert runs == [("acme", {"n": 2}, tick.instant, "t")]


async def test_redis_down_keeps_the_loops_and_a_redis_back_empty_stops_them(
    redis_factory: Callable[[], EmbeddedServer],
    clients: Callable[[str], Redis],
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = redis_factory()
    runs: list[TenantRun] = []
    scheduler = Scheduler(context("a", clients(server.url))).register(entries_only(prefix, runs))
    skips: list[dict[str, Any]] = []
    scheduler.on("skip", skips.append)
    await scheduler.add("TenantOnly", key="acme", cron="* * * * * *")
    with caplog.at_level(logging.INFO, logger="mega.scheduler"):
        await scheduler.start()
        try:
            await wait_for(lambda: len(runs) >= 1, timeout_s=5)
            server.stop()
            # The entry's loop keeps ticking: each tick meets the same Redis and skips.
            await wait_for(lambda: sum(s["key"] == "acme" for s in skips) >= 3, timeout_s=8)
            server.start()  # this Redis keeps nothing on disk: it is back without the entry
            await wait_for(lambda: "no more ticks here" in caplog.text, timeout_s=5)
            ran = len(runs)
            await scheduler.add("TenantOnly", key="globex", cron="* * * * * *")
            await wait_for(lambda: any(r[0] == "globex" for r in runs), timeout_s=5)
        finally:
            await scheduler.stop()
    assert len([r for r in runs[ran:] if r[0] == "acme"]) <= 1  # one claimed as it was removed
    watch_logs = [r.message for r in caplog.records if r.message.startswith("entries on")]
    assert len(watch_logs) == 2, watch_logs  # once while down, once when read again
    assert watch_logs[0] == (
        "entries on lock 'main' unreadable (network:ConnectionError): their "
        "loops keep ticking as they were"
    )
    assert watch_logs[1] == "entries on lock 'main' read again"
