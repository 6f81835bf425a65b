"""The inbox in Redis, on the session's Redis: `apply` runs an effect's commands and the mark of
the event id in one script, so the effect happens once per id even when the worker dies between
the effect and the framework's own mark; a listener group reaches it as `event.inbox`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from mega import Context, Event, EventBus, Listener, ListenerRunner, ReceivedEvent
from mega.drivers.memory import MemoryBus
from mega.events.inbox import KEY_PREFIX, Inbox
from mega.runtime import CacheAdapter
from mega.testing import memory_context
from tests.mega.jobs.test_contract import until


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)  # as the hosts' clients
    yield client
    await client.aclose()


async def test_apply_runs_the_commands_and_the_mark_once(redis: Redis, prefix: str) -> None:
    inbox = Inbox(redis, f"{prefix}-group", ttl_s=60)
    counts, log = f"{prefix}:counts", f"{prefix}:log"
    assert await inbox.apply("e1", ("HINCRBY", counts, "example.com", 1), ("RPUSH", log, "e1"))
    assert not await inbox.apply("e1", ("HINCRBY", counts, "example.com", 1), ("RPUSH", log, "e1"))
    assert await redis.hgetall(counts) == {"example.com": "1"}
    assert await redis.lrange(log, 0, -1) == ["e1"]
    assert await inbox.seen("e1") and not await inbox.seen("e2")
    assert 55 <= await redis.ttl(f"{KEY_PREFIX}{prefix}-group:e1") <= 60


async def test_a_command_redis_refuses_raises_and_leaves_no_mark(redis: Redis, prefix: str) -> None:
    inbox = Inbox(redis, f"{prefix}-group", ttl_s=60)
    await redis.set(f"{prefix}:text", "not a hash")
    with pytest.raises(ResponseError):
        await inbox.apply("e1", ("HINCRBY", f"{prefix}:text", "field", 1))
    assert not await inbox.seen("e1")  # the redelivery runs it again
    with pytest.raises(ValueError, match="an empty Redis command"):
        await inbox.apply("e1", ())


class Signed(Event):
    name = "inbox.signed"
    bus = "jobs"


class CountByDomain(Listener):
    event = Signed
    inbox = "main"

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        key = f"{event.data['prefix']}:domains"
        await event.inbox.apply(event.id, ("HINCRBY", key, event.data["domain"], 1))


async def test_a_group_applies_through_event_inbox_and_skips_what_was_applied(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    ctx = memory_context("jobs")
    ctx.caches["main"] = CacheAdapter("main", redis_url, redis)
    group: type[Listener] = type("CountByDomain", (CountByDomain,), {"group": f"{prefix}-count"})
    skipped: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    worker = ListenerRunner(ctx)
    worker.register(group)
    worker.on("skip", skipped.append)
    worker.on("done", done.append)
    await worker.start()
    bus = EventBus(ctx, "jobs")
    payload = {"prefix": prefix, "domain": "example.com"}
    try:
        first = await bus.emit(Signed, payload)
        await until(lambda: len(done) == 1, "the first event")
        # A worker killed after its run applied, before anything else: only the script's mark.
        second = f"{prefix}-e2"
        inbox = Inbox(redis, group.group, group.inbox_ttl_s)
        assert await inbox.apply(second, ("HINCRBY", f"{prefix}:domains", "example.com", 1))
        await bus.emit(Signed, payload, id=second)  # its redelivery
        ctx.bus("jobs", MemoryBus).native.dedup.clear()
        await bus.emit(Signed, payload, id=first)  # the first, again past the dedup window
        await until(lambda: len(skipped) == 2, "both skipped")
        assert sorted(signal["id"] for signal in skipped) == sorted([first, second])
        assert await redis.hgetall(f"{prefix}:domains") == {"example.com": "2"}
    finally:
        await worker.stop(5)
