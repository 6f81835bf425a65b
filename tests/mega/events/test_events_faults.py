"""Events under faults, with real processes: `mega worker` hosts sharing listener groups, a relay
SIGKILLed on either side of the PubAck, NATS stopped while commits go on, the inbox after the
dedup window, and two relays splitting rows on PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from mega import Context, EventBus, ListenerRunner, outbox
from mega.config import Config, load_config
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import EVENTS_STREAM
from mega.drivers.redis.client import RedisClient
from mega.runtime import OutboxRelay
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.events import fault_events
from tests.mega.jobs.test_contract import REDIS_BUS
from tests.processes import unmeasured_env
from tests.settled import settled

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 30.0


def classes(prefix: str) -> dict[str, Any]:
    """The fault_events classes as the workers see them (with the test's FAULT_PREFIX)."""
    event = type("Happened", (fault_events.Happened,), {"name": f"{prefix}.happened"})
    groups = {
        name: type(name, (fault_events.Recorder,), {"event": event, "group": f"{prefix}-{name}"})
        for name in ("a", "b", "c")
    }
    return {"event": event, **groups}


async def groups_settled(bus: EventBus, found: dict[str, Any], names: str = "abc") -> None:
    """Until each group's lane holds no event waiting or unsettled: none can run again."""
    for name in names:
        await settled(functools.partial(bus.stats, found[name]), f"group {name}")


def config_body(*, listeners: bool = True) -> str:
    names = "[GroupA, GroupB, GroupC]" if listeners else "[]"
    return (
        "from tests.mega.events.fault_events import GroupA, GroupB, GroupC, Happened\n"
        f"events = [Happened]\nlisteners = {names}\n"
        'outbox = {"poll_s": 0.2}\n'
    )


@pytest.fixture
async def setup(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Config, Context, RedisClient, dict[str, Any]]]:
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    config = load_config(
        write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=config_body())
    )
    ctx = await boot(config, role="test")
    yield config, ctx, ctx.cache("main").native, classes(prefix)
    await shutdown(ctx)


# `...`: a check binds its loop variable as a defaulted parameter (`lambda group=group: ...`),
# which mypy cannot match against `Callable[[], ...]`.
async def until(check: Callable[..., Any], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def runs(redis: RedisClient, prefix: str, group: str) -> dict[str, int]:
    found = await redis.hgetall(f"{prefix}:runs:{prefix}-{group}")
    return {_text(key): int(value) for key, value in found.items()}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def published(ctx: Context, prefix: str) -> int:
    """Messages the events stream holds for this test's events (the stream is shared, and made
    by the first publish: 0 before any test published)."""
    nats_bus = ctx.bus("jobs")
    assert isinstance(nats_bus, NatsBus)
    js = nats_bus.js
    try:
        info = await js.stream_info(EVENTS_STREAM, subjects_filter=f"events.{prefix}.>")
    except NotFoundError:
        return 0
    return sum((info.state.subjects or {}).values())


def start_worker(config: Path, prefix: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mega", "worker", "--config", str(config)],
            cwd=ROOT,
            env={**unmeasured_env(), "FAULT_PREFIX": prefix},  # SIGKILLed: never measured
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def commit_events(ctx: Context, event: Any, count: int) -> list[str]:
    def write(session: Any) -> list[str]:
        return [outbox.add(session, event, {"n": n}) for n in range(count)]

    return await ctx.db.run(write)


@pytest.mark.slow
async def test_three_groups_on_two_worker_processes_each_see_every_event_once(
    setup: Any, tmp_path: Path, prefix: str
) -> None:
    config, ctx, redis, found = setup
    workers = [start_worker(config.path, prefix, tmp_path / f"w{i}.log") for i in (1, 2)]
    try:
        bus = EventBus(ctx, "jobs")
        ids = [await bus.emit(found["event"], {"n": n}) for n in range(2000)]
        for group in ("a", "b", "c"):
            await until(lambda group=group: _count_is(redis, prefix, group, 2000), f"group {group}")
        await groups_settled(bus, found)  # nothing left to deliver again
        for group in ("a", "b", "c"):
            seen = await runs(redis, prefix, group)
            assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}, group
            pids = await redis.smembers(f"{prefix}:pids:{prefix}-{group}")
            assert len(pids) == 2, f"group {group} was not shared: {pids}"
    finally:
        for worker in workers:
            stop(worker)
        logs = "".join((tmp_path / f"w{i}.log").read_text() for i in (1, 2))
        assert "Traceback" not in logs, logs


@pytest.mark.slow
async def test_on_redis_a_worker_killed_mid_run_loses_no_event(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redis driver: two `mega worker` processes share three groups; one is SIGKILLed with
    runs in flight. Every event still runs in every group (the survivor claims the dead one's
    entries after the ack wait), and only what was in flight runs twice."""
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    body = REDIS_BUS + config_body()
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test", database=False)
    redis, found = ctx.cache("main").native, classes(prefix)
    workers = [start_worker(config.path, prefix, tmp_path / f"w{i}.log") for i in (1, 2)]
    try:
        bus = EventBus(ctx, "jobs")
        assert bus.bus.driver == "redis"
        ids = [await bus.emit(found["event"], {"n": n, "sleep_s": 0.05}) for n in range(300)]

        async def both_running() -> bool:
            return len(await redis.smembers(f"{prefix}:pids:{prefix}-a")) == 2

        await until(both_running, "both workers running group a")
        workers[0].kill()
        workers[0].wait()
        for group in ("a", "b", "c"):
            await until(lambda group=group: _count_is(redis, prefix, group, 300), f"group {group}")
        await groups_settled(bus, found)  # nothing left to deliver again
        for group in ("a", "b", "c"):
            seen = await runs(redis, prefix, group)
            assert sorted(seen) == sorted(ids), group
            twice = [event_id for event_id, count in seen.items() if count > 1]
            # In flight in the killed process: its 10 running, and finished ones not yet acked.
            assert len(twice) <= 20 and max(seen.values()) <= 2, (group, len(twice))
    finally:
        for worker in workers:
            stop(worker)
        await shutdown(ctx)
        log = (tmp_path / "w2.log").read_text()
        assert "Traceback" not in log, log


async def _count_is(redis: RedisClient, prefix: str, group: str, count: int) -> bool:
    return len(await runs(redis, prefix, group)) >= count


@pytest.mark.slow
@pytest.mark.parametrize("when", ["after_puback", "before_puback"])
async def test_a_relay_killed_mid_batch_loses_nothing_and_runs_nothing_twice(
    setup: Any, tmp_path: Path, prefix: str, when: str
) -> None:
    config, ctx, redis, found = setup
    ids = await commit_events(ctx, found["event"], 50)
    killed = subprocess.run(
        [sys.executable, "-m", "tests.mega.events.relay_process", str(config.path), when],
        cwd=ROOT,
        env={**os.environ, "FAULT_PREFIX": prefix},
        capture_output=True,
        timeout=60,
    )
    assert killed.returncode == -9, killed.stderr.decode()
    assert await published(ctx, prefix) == (50 if when == "after_puback" else 0)
    assert (await ctx.db.run(outbox.stats)).pending == 50  # nothing was marked

    listeners = ListenerRunner(ctx)
    listeners.register(found["a"])
    await listeners.start()
    relay = OutboxRelay(ctx)
    try:
        assert await relay.relay_once() == 50  # the next relay publishes every row again
        await until(lambda: _count_is(redis, prefix, "a", 50), "group a")
        await groups_settled(EventBus(ctx, "jobs"), found, "a")  # a stored copy would have run
        assert await published(ctx, prefix) == 50  # JetStream dropped the second publishes
        seen = await runs(redis, prefix, "a")
        assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}
        assert (await ctx.db.run(outbox.stats)).pending == 0
    finally:
        await listeners.stop(5)


@pytest.mark.slow
async def test_nats_down_the_outbox_grows_then_drains(
    tmp_path: Path, nats_factory: Any, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    nats = nats_factory()
    config = load_config(
        write_config(tmp_path, nats_url=nats.url, redis_url=redis_url, body=config_body())
    )
    ctx = await boot(config, role="test")
    found = classes(prefix)
    redis = ctx.cache("main").native
    listeners = ListenerRunner(ctx)
    listeners.register(found["a"])
    await listeners.start()
    relay = OutboxRelay(ctx, poll_s=0.1)
    await relay.start()
    ids: list[str] = []
    try:
        ids += await commit_events(ctx, found["event"], 20)
        await until(lambda: _count_is(redis, prefix, "a", 20), "first events")
        nats.stop()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # signups go on for 5 s with NATS down
            ids += await commit_events(ctx, found["event"], 5)
            await asyncio.sleep(0.1)
        waiting = (await ctx.db.run(outbox.stats)).pending
        assert waiting == len(ids) - 20  # every row of the outage waits in the outbox
        nats.start()
        await until(lambda: _count_is(redis, prefix, "a", len(ids)), "the drain", 60)
        seen = await runs(redis, prefix, "a")
        assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}
        assert (await ctx.db.run(outbox.stats)).pending == 0
    finally:
        await relay.stop()
        await listeners.stop(5)
        await shutdown(ctx)


async def test_the_inbox_skips_an_event_republished_after_the_dedup_window(
    tmp_path: Path, nats_factory: Any, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    nats = nats_factory()  # its own server: the events stream gets a short dedup window
    config = load_config(
        write_config(tmp_path, nats_url=nats.url, redis_url=redis_url, body=config_body())
    )
    ctx = await boot(config, role="test")
    redis, found = ctx.cache("main").native, classes(prefix)
    nats_bus = ctx.bus("jobs")
    assert isinstance(nats_bus, NatsBus)
    js = nats_bus.js
    # The stream as an operator might have made it, with a 1 s dedup window (never changed).
    await js.add_stream(
        StreamConfig(
            name=EVENTS_STREAM,
            subjects=["events.>", "events_requeue.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            duplicate_window=1.0,
        )
    )
    inboxed = type("Inboxed", (found["a"],), {"inbox": "main", "group": f"{prefix}-a"})
    counted: list[str] = []
    listeners = ListenerRunner(ctx)
    listeners.register(inboxed)
    listeners.on("skip", lambda signal: counted.append(signal["id"]))
    await listeners.start()
    bus = EventBus(ctx, "jobs")
    try:
        event_id = await bus.emit(found["event"], {"n": 1})
        await until(lambda: _count_is(redis, prefix, "a", 1), "the first delivery")
        await asyncio.sleep(1.5)  # past the stream's duplicate window
        assert await bus.emit(found["event"], {"n": 1}, id=event_id) == event_id
        await until(lambda: _true(len(counted) == 1), "the skip")
        assert await runs(redis, prefix, "a") == {event_id: 1}
        assert await published(ctx, prefix) == 2  # published twice, run once
    finally:
        await listeners.stop(5)
        await shutdown(ctx)


async def _true(value: bool) -> bool:
    return value


@pytest.mark.postgres
async def test_two_relays_on_postgres_split_the_rows(
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    monkeypatch.setenv("DATABASE_URL", postgres_url)
    config = load_config(
        write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=config_body())
    )
    contexts = [await boot(config, role=f"relay{i}") for i in (1, 2)]
    found = classes(prefix)
    try:
        ids = await commit_events(contexts[0], found["event"], 3000)
        relays = [OutboxRelay(ctx, batch=100) for ctx in contexts]

        async def drain(relay: OutboxRelay) -> None:
            while await relay.relay_once():
                pass

        await asyncio.gather(*(drain(relay) for relay in relays))
        counts = [relay.published for relay in relays]
        assert sum(counts) == len(ids) and all(counts), counts  # split, each row once
        assert await published(contexts[0], prefix) == len(ids)
        assert (await contexts[0].db.run(outbox.stats)).pending == 0
    finally:
        for ctx in contexts:
            await shutdown(ctx)
