"""Events end to end on SQLite and each bus driver (a real NATS, a real Redis, in memory): emit,
outbox + relay, listeners, fan-out, DLQ."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mega import Context, Event, ReceivedEvent
from mega.config import load_config
from mega.events.bus import EventBus
from mega.events.listener import Listener
from mega.events.runner import ListenerRunner
from mega.runtime.bootstrap import boot, shutdown
from mega.transactional.relay import OutboxRelay
from mega.transactional.store import OutboxRow, outbox
from tests.factories import write_config
from tests.mega.jobs.test_contract import MEMORY_BUS, REDIS_BUS

SEEN: dict[str, list[tuple[str, int]]] = {}


def make_classes(prefix: str) -> tuple[type[Event], type[Listener], type[Listener], type[Listener]]:
    class Signed(Event):
        name = f"{prefix}.signed_up"
        bus = "jobs"

    class Welcome(Listener):
        event = Signed
        group = f"{prefix}-welcome"
        backoff = {"type": "exponential", "initial": 10, "max": 20}

        async def run(self, event: ReceivedEvent, ctx: Context) -> None:
            SEEN.setdefault(self.group, []).append((event.id, event.attempt))

    class Stats(Welcome):
        group = f"{prefix}-stats"

    class Flaky(Welcome):
        group = f"{prefix}-flaky"
        retries = 1

        async def run(self, event: ReceivedEvent, ctx: Context) -> None:
            SEEN.setdefault(self.group, []).append((event.id, event.attempt))
            raise RuntimeError("crm down")

    return Signed, Welcome, Stats, Flaky


@pytest.fixture(params=["nats", "redis", "memory"])
async def ctx(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str
) -> AsyncIterator[Context]:
    body = {"nats": "", "redis": REDIS_BUS, "memory": MEMORY_BUS}[request.param]
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    config = load_config(path)
    context = await boot(config, role="test")
    yield context
    await shutdown(context)


async def until(predicate: Any, timeout_s: float = 10.0, what: Any = None) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out {what and what()}"
        await asyncio.sleep(0.02)


async def test_outbox_relay_listeners_fan_out_and_dlq(ctx: Context, prefix: str) -> None:
    Signed, Welcome, Stats, Flaky = make_classes(prefix)
    workers = ListenerRunner(ctx)
    for listener in (Welcome, Stats, Flaky):
        workers.register(listener)
    await workers.start()
    relay = OutboxRelay(ctx, poll_s=5)
    relay_task = asyncio.create_task(relay.run())
    try:

        def committed(session: Any) -> str:
            return outbox.add(session, Signed, {"email": "a@example.com"})

        event_id = await ctx.db.run(committed)

        def rolled_back(session: Any) -> None:
            outbox.add(session, Signed, {"email": "b@example.com"})
            raise RuntimeError("rollback")

        with pytest.raises(RuntimeError):
            await ctx.db.run(rolled_back)
        direct = await EventBus(ctx, "jobs").emit(Signed, {"email": "c@example.com"})
        await until(lambda: len(SEEN.get(Welcome.group, [])) == 2)
        await until(lambda: len(SEEN.get(Stats.group, [])) == 2)
        await until(lambda: len(SEEN.get(Flaky.group, [])) == 4)
        assert sorted(SEEN[Welcome.group]) == sorted([(event_id, 1), (direct, 1)])
        bus = workers.bus("jobs")
        records: list[Any] = []

        async def dead() -> None:
            while len(records) < 2:
                records[:] = await bus.dlq.list(Flaky)
                await asyncio.sleep(0.05)

        await asyncio.wait_for(dead(), 10)
        assert {r["id"] for r in records} == {event_id, direct}
        assert all(r["attempts"] == 2 and r["subject"] == f"{prefix}.signed_up" for r in records)
        rows = await ctx.db.run(lambda s: s.query(OutboxRow).all())
        assert [(r.event_id, r.published_at is not None) for r in rows] == [(event_id, True)]
        # A requeue reaches the failing group only.
        assert await bus.dlq.requeue(Flaky, event_id) == 1
        # It fails again: two more attempts, counted from 1.
        await until(lambda: len(SEEN[Flaky.group]) == 6, what=lambda: SEEN[Flaky.group])
        assert SEEN[Flaky.group][4:] == [(event_id, 1), (event_id, 2)]
        await asyncio.sleep(0.3)
        assert len(SEEN[Welcome.group]) == 2 and len(SEEN[Stats.group]) == 2
    finally:
        await relay.stop()
        relay_task.cancel()
        await workers.stop(5)
