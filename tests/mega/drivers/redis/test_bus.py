"""What only the redis driver's bus (mega/drivers/redis/bus.py) does, on the session's Redis:
where `publish` puts a job (the stream, the sorted set of delayed ones, a fair lane's list per
key) and the dedup key that drops a second one with its id; what `stats` reads of a job lane and
of a listener group on the shared events log. What every driver does is the contract suite's
(tests/mega/jobs/test_contract.py); the receiver's part is test_receiver.py's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mega.drivers.base import DEDUP_WINDOW_S, Delivery, Lane, LaneStats, Message
from mega.drivers.redis import RedisBus, RedisReceiver
from mega.drivers.redis.core import group_info
from mega.drivers.redis.lanes import as_text, lane_keys
from mega.settings import BusSpec
from tests.mega.drivers.lanes import group_lane, message, record

DEADLINE_S = 10.0


@pytest.fixture
async def bus(redis_url: str) -> AsyncIterator[RedisBus]:
    connected = await RedisBus.connect("jobs", BusSpec(driver="redis", url=redis_url))
    yield connected
    await connected.close()


def job_lane(prefix: str, *, fair: bool = False) -> Lane:
    return Lane("job", prefix, f"{prefix}.job", 10, 30.0, 3600.0, fair=fair)


def sent_at(
    job_id: str,
    subject: str,
    enqueued_at_ms: int,
    *,
    run_at_ms: int | None = None,
    dedup: bool = True,
    flow_key: str | None = None,
) -> Message:
    body = b'{"n":1}'
    return Message(job_id, subject, body, enqueued_at_ms, run_at_ms, dedup, flow_key=flow_key)


async def stats_become(bus: RedisBus, lane: Lane, wanted: LaneStats) -> LaneStats:
    """The lane's stats once they equal `wanted` (a receiver sends its acks in batches)."""
    deadline = time.monotonic() + DEADLINE_S
    while (stats := await bus.stats(lane)) != wanted:
        assert time.monotonic() < deadline, f"{stats}, {wanted} wanted"
        await asyncio.sleep(0.02)
    return stats


async def fetch(receiver: RedisReceiver, count: int) -> list[Delivery]:
    """Fetch until `count` deliveries came."""
    found: list[Delivery] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(found) < count:
        assert time.monotonic() < deadline, f"{len(found)} deliveries, {count} wanted"
        found += await receiver.fetch(count - len(found))
    return found


async def read_to_the_end(bus: RedisBus, receiver: RedisReceiver) -> None:
    """Fetch until the receiver's group has read the events log to its last entry: a new group
    starts at the oldest entry kept, and the session's other tests left theirs."""
    keys = receiver.keys
    deadline = time.monotonic() + DEADLINE_S
    while True:
        info = await bus.native.xinfo_stream(keys.stream)
        log = {as_text(key): value for key, value in info.items()}
        group = group_info(await bus.native.xinfo_groups(keys.stream), keys.group)
        if as_text(group["last-delivered-id"]) == as_text(log["last-generated-id"]):
            return
        assert time.monotonic() < deadline, "the log was not read to its end"
        assert await receiver.fetch(1000) == []  # none of this test's pattern


def ids(members: list[bytes | str]) -> list[str]:
    """The job ids of a fair lane's list (each member is its entry's fields as JSON)."""
    found = []
    for member in members:
        fields = json.loads(member)
        found.append(fields[fields.index("id") + 1])
    return found


async def test_a_given_id_is_stored_once_in_its_window_and_a_job_without_one_each_time(
    bus: RedisBus, prefix: str
) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    keys, now = lane_keys(lane), int(time.time() * 1000)
    assert await bus.publish(lane, [sent_at("same", lane.subject, now)]) == [True]
    later = sent_at("same", lane.subject, now, run_at_ms=now + 60_000)
    assert await bus.publish(lane, [sent_at("same", lane.subject, now), later]) == [False, False]
    free = [sent_at("free", lane.subject, now, dedup=False) for _ in range(2)]
    assert await bus.publish(lane, free) == [True, True]  # plain XADDs, no dedup key
    assert await bus.native.xlen(keys.stream) == 3
    assert await bus.native.zcard(keys.scheduled) == 0  # the delayed duplicate was dropped too
    assert await bus.native.exists(keys.dedup("same"), keys.dedup("free")) == 1
    assert 0 < await bus.native.ttl(keys.dedup("same")) <= DEDUP_WINDOW_S


async def test_a_fair_lanes_jobs_wait_in_a_list_per_key_and_a_push_feeds_one(
    bus: RedisBus, prefix: str
) -> None:
    lane = job_lane(prefix, fair=True)
    await bus.ensure(lane, apply_limits=False)
    keys, now = lane_keys(lane), int(time.time() * 1000)
    jobs = [
        sent_at(f"{key}{n}", lane.subject, now, flow_key=key)
        for n, key in enumerate(["a", "a", "a", "b"], start=1)
    ]
    assert await bus.publish(lane, jobs) == [True] * 4
    # The first push fed its job to the stream (none was waiting there); the others wait.
    entries: Any = await bus.native.xrange(keys.stream)
    assert [fields[b"id"] for _, fields in entries] == [b"a1"]
    assert ids(await bus.native.lrange(keys.fair_prefix + "a", 0, -1)) == ["a2", "a3"]
    assert ids(await bus.native.lrange(keys.fair_prefix + "b", 0, -1)) == ["b4"]
    assert await bus.native.lrange(keys.fair_turns, 0, -1) == [b"a", b"b"]
    assert await bus.native.get(keys.fair_count) == b"3"
    assert await bus.stats(lane) == LaneStats(pending=4, in_flight=0, dlq=0)
    receiver = bus.receiver(lane, consumer="w1")
    try:  # a fetch feeds a job of each key in turn
        assert [d.id for d in await fetch(receiver, 4)] == ["a1", "a2", "b4", "a3"]
    finally:
        await receiver.close()
    assert await bus.native.get(keys.fair_count) == b"0"


async def test_a_job_lanes_stats_count_the_stream_the_delayed_the_running_and_the_dead(
    bus: RedisBus, prefix: str
) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    now = int(time.time() * 1000)
    jobs = [sent_at(f"j{n}", lane.subject, now - 3000 + n * 1000) for n in range(2)]
    later = sent_at("later", lane.subject, now - 5000, run_at_ms=now + 3_600_000)
    assert await bus.publish(lane, [*jobs, later]) == [True] * 3
    stats = await bus.stats(lane)
    assert stats == LaneStats(pending=3, in_flight=0, dlq=0)
    # The delayed job waits in the sorted set: not dated, not yet added to the stream.
    assert (stats.oldest_ms, stats.stored) == (now - 3000, 2)
    receiver = bus.receiver(lane, consumer="w1")
    try:
        [running] = await fetch(receiver, 1)
        assert running.id == "j0"
        assert await bus.stats(lane) == LaneStats(pending=2, in_flight=1, dlq=0)
        await receiver.dead_letter(running, record(running, 1), terminate=False)
        stats = await bus.stats(lane)
        assert stats == LaneStats(pending=2, in_flight=0, dlq=1)
        assert (stats.oldest_ms, stats.stored) == (now - 2000, 2)
    finally:
        await receiver.close()


async def test_a_groups_stats_count_every_unread_event_of_the_log_and_its_own_retries(
    bus: RedisBus, prefix: str
) -> None:
    lane = group_lane(f"{prefix}_g", f"{prefix}.user.*")
    await bus.ensure_events(max_age_s=3600)
    await bus.ensure(lane, apply_limits=False)
    receiver = bus.receiver(lane, consumer="w1")
    try:
        await read_to_the_end(bus, receiver)
        before = await stats_become(bus, lane, LaneStats(0, 0, 0))
        now = int(time.time() * 1000)
        names = [f"{prefix}.user.signed_up", f"{prefix}.order.paid", f"{prefix}.user.left"]
        events = [sent_at(f"{prefix}-{n}", name, now + n) for n, name in enumerate(names)]
        assert await bus.emit(events, max_age_s=3600) == [True] * 3
        stats = await bus.stats(lane)
        assert stats == LaneStats(pending=3, in_flight=0, dlq=0)  # its pattern's or not
        assert (stats.oldest_ms, stats.stored - before.stored) == (now, 3)

        heard = await fetch(receiver, 2)  # the other pattern's is acknowledged unrun
        assert [d.subject for d in heard] == [names[0], names[2]]
        await stats_become(bus, lane, LaneStats(pending=0, in_flight=2, dlq=0))
        await receiver.retry(heard[0], due_ms=now + 3_600_000, attempts=1)
        await receiver.dead_letter(heard[1], record(heard[1], 1), terminate=False)
        # The retry waits on the group's own side, counted as pending until its time.
        assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=1)
    finally:
        await receiver.close()


async def test_publish_refuses_a_listener_group(bus: RedisBus, prefix: str) -> None:
    lane = group_lane(f"{prefix}_g", f"{prefix}.*")
    with pytest.raises(ValueError, match=f"publish\\(\\) stores jobs; {prefix}_g is a listener"):
        await bus.publish(lane, [message("a", f"{prefix}.x")])
