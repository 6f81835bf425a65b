"""mega.schedules.schedule + mega.schedules.scheduler against a real Redis."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeGuard

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from mega.context import Context
from mega.drivers.embedded import EmbeddedServer
from mega.drivers.redis.client import RedisClient
from mega.errors import LockBackendError, RegistrationError
from mega.schedules import locks
from mega.schedules.guard import EARLY_WAIT_LIMIT_S
from mega.schedules.locks import CLAIM_TOLERANCE_MS, RedLock
from mega.schedules.schedule import LockSettings, Schedule, Tick, has_hash_tag
from mega.schedules.scheduler import Scheduler
from mega.schedules.ticks import TickResult

Run = tuple[datetime, str, int | None, str]  # planned instant, instance, fence, source


def context(instance: str, client: RedisClient) -> Context:
    return Context(instance_id=instance, locks={"main": RedLock("main", [client])})


def schedule(
    key: str | None,
    runs: list[Run],
    *,
    expr: str = "* * * * * *",
    ttl_ms: int = 5_000,
    sleep_s: float = 0.0,
    error: Exception | None = None,
) -> type[Schedule]:
    """A Schedule that records each run; `key` None means no lock."""
    lock_settings: LockSettings | None = (
        None if key is None else {"lock": "main", "ttl": ttl_ms, "key": key}
    )

    class Probe(Schedule):
        cron = expr
        timezone = "UTC"
        lock = lock_settings

        async def run(self, ctx: Context) -> None:
            assert ctx.extras["tick"] is self.tick
            runs.append(
                (self.tick.instant, self.tick.instance_id, self.tick.fence, self.tick.source)
            )
            await asyncio.sleep(sleep_s)
            if error is not None:
                raise error

    return Probe


async def wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def strictly_increasing(values: list[int | None]) -> TypeGuard[list[int]]:
    numbers = [value for value in values if value is not None]
    return len(numbers) == len(values) and all(a < b for a, b in itertools.pairwise(numbers))


# -- registration (pure) --------------------------------------------------------------------


def bad(**attrs: Any) -> type[Schedule]:
    async def run(self: Schedule, ctx: Context) -> None:
        return None

    body: dict[str, Any] = {"cron": "* * * * *", "timezone": "UTC", "run": run, **attrs}
    return type("Bad", (Schedule,), {k: v for k, v in body.items() if v is not MISSING})


MISSING = object()


def sync_run(self: Schedule, ctx: Context) -> None:
    return None


@pytest.mark.parametrize(
    ("attrs", "field"),
    [
        ({"cron": MISSING}, "cron: missing"),
        ({"cron": "nope"}, "cron:"),
        ({"cron": "0 0 31 2 *"}, "cron:"),
        ({"timezone": "Mars/Base"}, "timezone:"),
        ({"timezone": 9}, "timezone:"),
        ({"lock": {"lock": "other", "ttl": 1000}}, "lock.lock: alias 'other' is not declared"),
        ({"lock": {"ttl": 1000}}, "lock.lock"),
        ({"lock": {"lock": "main"}}, "lock.ttl"),
        ({"lock": {"lock": "main", "ttl": 0}}, "lock.ttl"),
        ({"lock": {"lock": "main", "ttl": -5}}, "lock.ttl"),
        ({"lock": {"lock": "main", "ttl": True}}, "lock.ttl"),
        ({"lock": {"lock": "main", "ttl": 1.5}}, "lock.ttl"),
        ({"lock": {"lock": "main", "ttl": "1000"}}, "lock.ttl"),
        ({"lock": {"lock": "main", "ttl": 1000, "tll": 5}}, "lock: unknown keys ['tll']"),
        ({"lock": {"lock": "main", "ttl": 1000, "key": ""}}, "lock.key"),
        ({"lock": "main"}, "lock: must be a dict"),
        ({"run": MISSING}, "run: not overridden"),
        ({"run": sync_run}, "run: must be `async def"),
    ],
)
def test_register_fails_fast_on_each_bad_field(
    attrs: dict[str, Any], field: str, redis_url: str
) -> None:
    scheduler = Scheduler(context("a", Redis.from_url(redis_url)))
    with pytest.raises(RegistrationError) as caught:
        scheduler.register(bad(**attrs))
    assert field in caught.value.message
    assert "'Bad'" in caught.value.message
    assert scheduler.names == []


def test_register_reports_every_problem_at_once(redis_url: str) -> None:
    scheduler = Scheduler(context("a", Redis.from_url(redis_url)))
    broken = bad(cron=MISSING, timezone="Nowhere/City", lock={"lock": "x", "ttl": 0})
    with pytest.raises(RegistrationError) as caught:
        scheduler.register(broken)
    for field in ("cron: missing", "timezone:", "lock.lock", "lock.ttl"):
        assert field in caught.value.message


def test_register_rejects_duplicates_and_non_schedules(redis_url: str) -> None:
    scheduler = Scheduler(context("a", Redis.from_url(redis_url)))
    scheduler.register(bad())
    with pytest.raises(RegistrationError, match="already registered"):
        scheduler.register(bad())
    with pytest.raises(RegistrationError, match="not a Schedule"):
        scheduler.register(int)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "tagged"),
    [
        ("{a}", True),
        ("mega:schedule:{Nightly}", True),
        ("}{a}", True),
        ("a", False),
        ("x{}y{a}", False),
        ("{a", False),
    ],
)
def test_a_hash_tag_is_the_first_braces_with_something_in_them(key: str, tagged: bool) -> None:
    assert has_hash_tag(key) is tagged


async def test_a_lock_key_without_a_hash_tag_is_refused_on_a_redis_cluster(
    lock_clients: Callable[[], Awaitable[RedisClient]], prefix: str
) -> None:
    """A tick's claim, guard and fence are one script, whose keys a Redis Cluster needs in one
    slot: the default key has a tag; a key of one's own without one is refused there only."""
    scheduler = Scheduler(context("a", client := await lock_clients()))
    untagged = schedule(f"{prefix}:reports", [])
    if isinstance(client, RedisCluster):
        with pytest.raises(RegistrationError) as caught:
            scheduler.register(untagged)
        assert f"tag the key, e.g. '{{{prefix}:reports}}'" in caught.value.message
    else:
        scheduler.register(untagged)
    tagged = schedule(f"{{{prefix}}}:reports", [])
    tagged.name = "Tagged"
    scheduler.register(tagged).register(bad(lock={"lock": "main", "ttl": 1000}))
    assert scheduler.describe("Bad")["lock"]["key"] == "mega:schedule:{Bad}"


def test_missing_timezone_warns_once_at_register(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = Scheduler(context("a", Redis.from_url(redis_url)))
    with caplog.at_level(logging.WARNING, logger="mega.scheduler"):
        scheduler.register(bad(timezone=None))
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "host's local time" in caplog.records[0].message


def test_unknown_event_name_raises(redis_url: str) -> None:
    scheduler = Scheduler(context("a", Redis.from_url(redis_url)))
    with pytest.raises(ValueError, match="unknown signal 'tick'"):
        scheduler.on("tick", lambda event: None)
    scheduler.on("skip", lambda event: None)


def test_name_defaults_to_the_class_name_and_describe(redis_url: str) -> None:
    class Nightly(Schedule):
        cron = "0 3 * * *"
        timezone = "Asia/Seoul"
        lock: ClassVar[LockSettings] = {"lock": "main", "ttl": 20_000}

        async def run(self, ctx: Context) -> None:
            return None

    scheduler = Scheduler(context("a", Redis.from_url(redis_url))).register(Nightly)
    info = scheduler.describe("Nightly")
    assert info["cron"] == "0 3 * * *"
    assert info["timezone"] == "Asia/Seoul"
    assert info["lock"] == {"lock": "main", "ttl": 20_000, "key": "mega:schedule:{Nightly}"}
    assert len(info["next_runs"]) == 5
    assert all(run.endswith("T03:00:00+09:00") for run in info["next_runs"])


# -- the cluster guarantee ------------------------------------------------------------------


async def test_two_instances_run_each_tick_exactly_once(
    lock_clients: Callable[[], Awaitable[RedisClient]], prefix: str
) -> None:
    """On one Redis, and on a Redis Cluster (claim, guard and fence in the slot of the key's
    hash tag)."""
    runs: list[Run] = []
    probe = schedule(f"{{{prefix}}}", runs)
    a = Scheduler(context("a", await lock_clients())).register(probe)
    b = Scheduler(context("b", await lock_clients())).register(probe)
    await a.start()
    await b.start()
    started = datetime.now(UTC)
    await wait_for(lambda: len(runs) >= 6, timeout_s=12)
    stopping = datetime.now(UTC)
    await a.stop()
    await b.stop()

    # Instants both loops planned: after both started, and settled before the stop.
    window = sorted({r[0] for r in runs if started < r[0] <= stopping - timedelta(seconds=1)})
    assert len(window) >= 4
    per_instant = Counter(r[0] for r in runs)
    assert all(per_instant[instant] == 1 for instant in window)
    fences = [r[2] for r in sorted(runs, key=lambda r: r[0])]
    assert all(isinstance(fence, int) for fence in fences)
    assert strictly_increasing(fences)

    ticks = {t["instant"]: t for t in await a.recent_ticks("Probe", limit=100)}
    assert ticks == {t["instant"]: t for t in await b.recent_ticks("Probe", limit=100)}
    for instant in window:
        tick = ticks[instant.isoformat()]
        winner = next(r[1] for r in runs if r[0] == instant)
        loser = "b" if winner == "a" else "a"
        assert tick["winner"] == winner
        assert tick["skipped"] == [{"instance": loser, "reason": "claimed by another instance"}]
        assert 0 <= tick["lateness_ms"] < 1000
        assert tick["source"] == "schedule"


async def test_a_tick_meeting_a_long_run_is_consumed_by_the_overlap_guard(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    probe = schedule(prefix, runs, sleep_s=1.3)  # longer than the period
    a = Scheduler(context("a", clients(redis_url))).register(probe)
    b = Scheduler(context("b", clients(redis_url))).register(probe)
    await a.start()
    await b.start()
    await wait_for(lambda: len(runs) >= 3, timeout_s=12)
    await a.stop()
    await b.stop()

    assert len({r[0] for r in runs}) == len(runs)  # never twice, never overlapping
    assert strictly_increasing([r[2] for r in sorted(runs, key=lambda r: r[0])])
    first, last = min(r[0] for r in runs), max(r[0] for r in runs)
    ticks = [t for t in await a.recent_ticks("Probe", limit=100) if t["winner"] is None]
    between = [t for t in ticks if first < datetime.fromisoformat(t["instant"]) < last]
    assert between, "no tick fell on a running run"
    for tick in between:  # one instance met the guard; the claim kept the other one out
        reasons = sorted(skip["reason"] for skip in tick["skipped"])
        assert reasons == ["claimed by another instance", "overlap: the previous run still runs"]
        assert tick["source"] == "schedule"


async def test_quorum_lock_with_one_server_down_still_runs_each_tick_once(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis], prefix: str
) -> None:
    servers = [redis_factory() for _ in range(3)]
    servers[2].stop()  # a minority down (the audit lives on the first server)

    def quorum(instance: str) -> Context:
        lock = RedLock("main", [clients(server.url) for server in servers])
        return Context(instance_id=instance, locks={"main": lock})

    runs: list[Run] = []
    probe = schedule(prefix, runs)
    a = Scheduler(quorum("a")).register(probe)
    b = Scheduler(quorum("b")).register(probe)
    before_ms = int(time.time() * 1000)
    manual = await a.run_now("Probe")
    assert manual.ran is True and manual.fence is not None and manual.fence >= before_ms - 1000
    await a.start()
    await b.start()
    await wait_for(lambda: len(runs) >= 4, timeout_s=10)
    await a.stop()
    await b.stop()

    scheduled = [r for r in runs if r[3] == "schedule"]
    assert Counter(r[0] for r in scheduled).most_common(1)[0][1] == 1
    assert strictly_increasing([r[2] for r in runs])
    ticks = [t for t in await a.recent_ticks("Probe", limit=100) if t["source"] == "schedule"]
    assert all(
        skip["reason"] == "claimed by another instance" for t in ticks for skip in t["skipped"]
    )


@pytest.mark.slow
async def test_quorum_ticks_stay_exactly_once_while_a_lock_server_is_sigkilled(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis], prefix: str
) -> None:
    """Two schedulers, a quorum over three Redis servers, one SIGKILLed mid-run of the cluster
    (and later back, empty): every planned instant still runs exactly once."""
    servers = [redis_factory() for _ in range(3)]

    def quorum(instance: str) -> Context:
        lock = RedLock("main", [clients(server.url) for server in servers])
        return Context(instance_id=instance, locks={"main": lock})

    runs: list[Run] = []
    probe = schedule(prefix, runs)
    schedulers = [Scheduler(quorum(name)).register(probe) for name in ("a", "b")]
    for scheduler in schedulers:
        await scheduler.start()
    await wait_for(lambda: len(runs) >= 3, timeout_s=10)
    servers[1].kill()  # SIGKILL: no goodbye to the clients
    killed_at = len(runs)
    await wait_for(lambda: len(runs) >= killed_at + 3, timeout_s=10)
    servers[1].start()  # back with nothing (no persistence)
    back_at = len(runs)
    await wait_for(lambda: len(runs) >= back_at + 2, timeout_s=10)
    for scheduler in schedulers:
        await scheduler.stop()
    instants = Counter(r[0] for r in runs if r[3] == "schedule")
    assert instants.most_common(1)[0][1] == 1, "an instant ran twice"
    assert {r[1] for r in runs} <= {"a", "b"} and strictly_increasing([r[2] for r in runs])


async def test_lockless_schedule_runs_on_every_instance(
    redis_url: str, clients: Callable[[str], Redis]
) -> None:
    runs: list[Run] = []
    probe = schedule(None, runs)
    a = Scheduler(context("a", clients(redis_url))).register(probe)
    b = Scheduler(context("b", clients(redis_url))).register(probe)
    assert (await a.run_now("Probe")).ran and (await b.run_now("Probe")).ran
    assert [(r[1], r[2], r[3]) for r in runs] == [("a", None, "manual"), ("b", None, "manual")]
    ticks = await a.recent_ticks("Probe")
    assert len(ticks) == 1 and ticks[0]["winner"] == "a"  # in memory, this instance only


async def test_fifty_schedules_on_one_clock_all_run_at_each_instant(
    lock_clients: Callable[[], Awaitable[RedisClient]],
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One clock for every schedule, and the pause records of the schedules due at once read in
    one round trip: 50 locked schedules due at the same instants (every third second), on the
    client a host makes (a pool of 64 connections), all run at each instant and none is
    skipped. (Few and every other second: on the suite's busy machine 200 claims at once timed
    out on the lock's round trip, and 200 a second met their own guards. A scheduler's ceiling,
    about 1,400 locked ticks a second on 2 cores, is the schedules curve's business.) On a
    Redis Cluster too, where those reads and the audit's writes span the masters. The claims'
    bound is 5 s here, not 1 s: while the whole suite runs on 2 cores a round trip can stall
    past a second (three CI runs saw a claim or two of 50 time out), and this test is about the
    clock, not that bound (the outage tests hold it). Every third second, not every other: a CI
    run saw the whole loop stall past 2 s once, and the overlap guard skip each schedule.
    Neither the first instant nor the last is counted: the first may come while the 50 are
    still starting and the client opens its connections (beside two busy loops, on a Redis
    Cluster, 39 of 50 ran at the first instant and all 50 at each after), the last while it
    stops."""
    monkeypatch.setattr(locks, "OP_TIMEOUT_S", 5.0)
    client = await lock_clients()
    runs: list[Run] = []
    scheduler = Scheduler(context("a", client))
    for n in range(50):
        probe = schedule(f"{{{prefix}:{n}}}", runs, expr="*/3 * * * * *")  # a slot each
        probe.name = f"Probe{n:03d}"
        scheduler.register(probe)
    skips: list[dict[str, Any]] = []
    scheduler.on("skip", skips.append)
    await scheduler.start()
    try:
        await wait_for(lambda: len({run[0] for run in runs}) >= 5, timeout_s=45)
    finally:
        await scheduler.stop()
    assert skips == [], Counter(skip["reason"] for skip in skips)
    per_instant = Counter(run[0] for run in runs)
    whole = sorted(per_instant)[1:-1]  # the first and the last are partial (above)
    assert len(whole) >= 3
    assert [per_instant[instant] for instant in whole] == [50] * len(whole)


async def test_run_now_goes_through_the_lock(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(
        schedule(prefix, runs, sleep_s=0.5)
    )
    events: list[dict[str, Any]] = []
    scheduler.on("skip", events.append)
    first = asyncio.create_task(scheduler.run_now("Probe"))
    await wait_for(lambda: len(runs) == 1, timeout_s=5)
    second = await scheduler.run_now("Probe")
    assert second.ran is False
    assert second.reason is not None and second.reason.startswith("overlap")
    result = await first
    assert result.ran is True and result.reason is None and result.fence is not None
    assert runs[0][1:] == ("a", result.fence, "manual")
    assert [e["source"] for e in events] == ["manual"]
    third = await scheduler.run_now("Probe")
    assert third.ran is True and third.fence is not None and third.fence > result.fence
    history = await scheduler.recent_ticks("Probe")
    assert [t["winner"] for t in history] == ["a", None, "a"]
    assert history[1]["skipped"][0]["reason"].startswith("overlap")


async def test_run_failure_and_release_failure_are_fail_events(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    class BrokenRelease(RedLock):
        async def release(self, key: str, token: str) -> bool:
            raise LockBackendError("release refused")

    runs: list[Run] = []
    ctx = Context(instance_id="a", locks={"main": BrokenRelease("main", [clients(redis_url)])})
    scheduler = Scheduler(ctx).register(schedule(prefix, runs, error=RuntimeError("boom")))
    fails: list[dict[str, Any]] = []
    scheduler.on("fail", fails.append)
    result = await scheduler.run_now("Probe")
    assert result.ran is True and result.error == "RuntimeError: boom"
    assert [(f["phase"], f["error"]) for f in fails] == [
        ("run", "RuntimeError: boom"),
        ("release", "LockBackendError: release refused"),
    ]


async def test_a_run_longer_than_its_ttl_keeps_the_guard_renewed(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(
        # Renewed every 200 ms: a busy machine may delay one renewal by 400 ms and lose nothing.
        schedule(prefix, runs, ttl_ms=600, sleep_s=2.0)
    )
    fails: list[dict[str, Any]] = []
    scheduler.on("fail", fails.append)
    long_run = asyncio.create_task(scheduler.run_now("Probe"))
    await wait_for(lambda: len(runs) == 1, timeout_s=5)
    await asyncio.sleep(1.0)  # the run itself goes on, past the 600 ms ttl: renewed, still held
    late = await scheduler.run_now("Probe")
    assert late.ran is False and late.reason == "overlap: the previous run still runs"
    assert (await long_run).ran is True
    assert fails == []  # released with its token: it never expired
    assert await clients(redis_url).exists(f"{prefix}:running") == 0


async def test_extras_reach_the_manual_runs_context(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    seen: list[Any] = []

    class Asks(Schedule):
        cron = "0 0 1 1 *"
        timezone = "UTC"
        lock: ClassVar[LockSettings] = {"lock": "main", "ttl": 5_000, "key": prefix}

        async def run(self, ctx: Context) -> None:
            seen.append((ctx.extras.get("hold_ms"), ctx.extras["tick"] is self.tick))

    scheduler = Scheduler(context("a", clients(redis_url))).register(Asks)
    assert (await scheduler.run_now("Asks", extras={"hold_ms": 7})).ran is True
    assert (await scheduler.run_now("Asks")).ran is True
    assert seen == [(7, True), (None, True)]


async def test_a_run_whose_renewals_fail_is_reported(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    class Stalls(Schedule):
        cron = "0 0 1 1 *"
        timezone = "UTC"
        lock: ClassVar[LockSettings] = {"lock": "main", "ttl": 100, "key": prefix}

        async def run(self, ctx: Context) -> None:
            time.sleep(0.3)  # blocks the event loop: no renewal can run, the guard expires

    scheduler = Scheduler(context("a", clients(redis_url))).register(Stalls)
    fails: list[dict[str, Any]] = []
    scheduler.on("fail", fails.append)
    assert (await scheduler.run_now("Stalls")).ran is True
    assert [f["phase"] for f in fails] == ["release"]
    assert "guard expired" in fails[0]["error"] and "100 ms" in fails[0]["error"]


# -- whose clock: the lock server's ----------------------------------------------------------


async def fire_at(scheduler: Scheduler, name: str, planned: datetime) -> TickResult:
    """One scheduled tick of `name` for the instant `planned`, as the loop fires it when this
    host's clock reads `planned`: an instant still ahead of the real clock is what a scheduler
    whose clock runs fast fires."""
    return await scheduler.ticks.tick(scheduler._specs[name], planned, "schedule")


async def test_a_tick_fired_before_its_instant_waits_for_the_lock_servers_clock(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(schedule(prefix, runs))
    started: list[float] = []  # by this process's clock, which is the lock server's here
    scheduler.on("run", lambda signal: started.append(time.time()))
    clocks: list[dict[str, Any]] = []
    scheduler.on("clock", clocks.append)
    planned = datetime.now(UTC) + timedelta(seconds=0.8)  # a clock 0.8 s fast fires now
    result = await fire_at(scheduler, "Probe", planned)
    assert result.ran is True and [r[0] for r in runs] == [planned]
    assert started[0] >= planned.timestamp() - CLAIM_TOLERANCE_MS / 1000
    assert started[0] < planned.timestamp() + 0.5
    assert len(clocks) == 2  # refused as early, then claimed: each reply measured the offset
    assert all(c["lock"] == "main" and abs(c["offset_ms"]) < 50 for c in clocks)


async def test_a_tick_fired_too_far_before_its_instant_is_skipped_here(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(schedule(prefix, runs))
    planned = datetime.now(UTC) + timedelta(seconds=EARLY_WAIT_LIMIT_S + 5)
    began = time.monotonic()
    result = await fire_at(scheduler, "Probe", planned)
    assert time.monotonic() - began < 1  # no minute-long wait: a clock this far off is broken
    assert result.ran is False and runs == []
    assert result.reason is not None and result.reason.startswith("early: the lock server's")
    claim = f"{prefix}:tick:{int(planned.timestamp())}"
    assert await scheduler.ctx.lock("main").native.exists(claim) == 0  # left for the peers


# -- failure and shutdown -------------------------------------------------------------------


async def test_redis_down_is_a_skip_and_ticks_resume_after_restart(
    redis_factory: Callable[[], EmbeddedServer], clients: Callable[[str], Redis], prefix: str
) -> None:
    server = redis_factory()
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(server.url))).register(schedule(prefix, runs))
    skips: list[dict[str, Any]] = []
    scheduler.on("skip", skips.append)
    await scheduler.start()
    await wait_for(lambda: len(runs) >= 1, timeout_s=5)
    server.stop()
    ran_before = len(runs)
    await wait_for(lambda: len(skips) >= 2, timeout_s=6)
    assert len(runs) <= ran_before + 1  # at most a tick already past its lock when it stopped
    assert all(s["reason"].startswith("lock backend error: ") for s in skips)
    assert f"127.0.0.1:{server.port}" in skips[0]["reason"]
    server.start()
    resumed_from = len(runs)
    await wait_for(lambda: len(runs) >= resumed_from + 2, timeout_s=8)
    await scheduler.stop()
    # This Redis keeps nothing on disk: the fence counter came back empty, and still the fences
    # rose across the restart (each is at least its tick's planned instant in epoch ms).
    fences = [r[2] for r in runs]
    assert strictly_increasing(fences) and fences[resumed_from] > fences[resumed_from - 1]


async def test_stop_waits_for_a_running_run(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    finished: list[Tick] = []

    class Slow(Schedule):
        cron = "* * * * * *"
        timezone = "UTC"
        lock: ClassVar[LockSettings] = {"lock": "main", "ttl": 10_000, "key": prefix}

        async def run(self, ctx: Context) -> None:
            runs.append((self.tick.instant, "a", self.tick.fence, self.tick.source))
            await asyncio.sleep(1.0)  # the run itself: a second long
            finished.append(self.tick)

    scheduler = Scheduler(context("a", clients(redis_url))).register(Slow)
    await scheduler.start()
    await wait_for(lambda: len(runs) == 1, timeout_s=5)
    await scheduler.stop(timeout_s=5)
    assert len(finished) == len(runs) == 1
    assert await scheduler.ctx.lock("main").native.get(f"{prefix}:running") is None


async def test_stop_is_bounded_and_cancelled_runs_release_the_guard(
    redis_url: str, clients: Callable[[str], Redis], prefix: str
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(
        schedule(prefix, runs, sleep_s=30)
    )
    fails: list[dict[str, Any]] = []
    scheduler.on("fail", fails.append)
    await scheduler.start()
    await wait_for(lambda: len(runs) == 1, timeout_s=5)
    began = time.monotonic()
    await scheduler.stop(timeout_s=0.2)
    assert time.monotonic() - began < 3
    assert [f["phase"] for f in fails] == ["run"]
    assert fails[0]["error"].startswith("cancelled")
    assert await scheduler.ctx.lock("main").native.get(f"{prefix}:running") is None


async def test_an_instant_missed_by_a_stalled_loop_is_an_audited_skip(
    redis_url: str, clients: Callable[[str], Redis]
) -> None:
    runs: list[Run] = []
    scheduler = Scheduler(context("a", clients(redis_url))).register(schedule(None, runs))
    skips: list[dict[str, Any]] = []
    scheduler.on("skip", skips.append)
    await scheduler.start()
    try:
        await wait_for(lambda: len(runs) >= 1, 3)
        time.sleep(2.3)  # the event loop stalls (a blocking call): the next instant is missed
        await wait_for(lambda: len(skips) >= 1, 3)
    finally:
        await scheduler.stop()
    assert skips[0]["reason"].startswith("missed:")
    assert skips[0]["lateness_ms"] > 1000
    ticks = await scheduler.recent_ticks("Probe")
    missed = [t for t in ticks if t["winner"] is None]
    assert missed and missed[0]["skipped"][0]["reason"].startswith("missed:")
