"""The redis driver through `Bus` and `Receiver` alone (no JobQueue, no EventBus), on a real
Redis. Event names and groups carry the test's prefix: the events log is shared by the
session's tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from mega.drivers.base import Delivery, DriverUnavailable, Lane, LaneStats
from mega.drivers.redis import RedisBus, RedisReceiver
from mega.drivers.redis.lanes import lane_keys
from mega.drivers.redis.scripts import EVENTS_LOG
from mega.errors import DependencyUnavailable
from mega.settings import BusSpec
from tests.mega.drivers.lanes import group_lane, message, record

ACK_WAIT_S = 0.3


@pytest.fixture
async def bus(redis_url: str) -> AsyncIterator[RedisBus]:
    connected = await RedisBus.connect("jobs", BusSpec(driver="redis", url=redis_url))
    yield connected
    await connected.close()


def job_lane(prefix: str, ack_wait_s: float = 30.0) -> Lane:
    return Lane("job", prefix, f"{prefix}.job", 10, ack_wait_s, 3600.0)


async def collect(receiver: RedisReceiver, count: int, timeout_s: float = 5.0) -> list[Delivery]:
    """Fetch until `count` deliveries came (or the deadline), then check that no more come."""
    found: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        found += await receiver.fetch(count - len(found))
    found += await receiver.fetch(10)  # one more round: nothing beyond `count`
    return found


async def stats_become(bus: RedisBus, lane: Lane, wanted: LaneStats) -> LaneStats:
    deadline = time.monotonic() + 5
    while (stats := await bus.stats(lane)) != wanted and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return stats


async def test_connect_names_the_url_when_redis_is_away() -> None:
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(DependencyUnavailable) as caught:
        await RedisBus.connect("jobs", BusSpec(driver="redis", url=url))
    assert caught.value.dependency == "redis"
    assert f"cannot reach Redis 'jobs' at {url} (" in caught.value.message


async def test_the_bus_says_what_it_is(bus: RedisBus) -> None:
    assert RedisBus.driver == "redis"
    assert isinstance(bus.native, Redis)
    assert bus.connected
    await bus.ping()


async def test_publish_fetch_ack(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    assert await bus.publish(lane, [message("a", lane.subject)]) == [True]
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await collect(receiver, 1)
    assert (delivery.id, delivery.subject, delivery.body, delivery.attempt) == (
        "a",
        lane.subject,
        b'{"n":1}',
        1,
    )
    assert delivery.enqueued_at_ms is not None and delivery.run_at_ms is not None
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=1, dlq=0)
    await receiver.ack(delivery)
    assert await stats_become(bus, lane, LaneStats(0, 0, 0)) == LaneStats(0, 0, 0)
    await receiver.close()
    assert await bus.native.xlen(lane_keys(lane).stream) == 0  # acked and deleted


async def test_many_acks_leave_in_batches(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    kept = await bus.publish(lane, [message(str(n), lane.subject, dedup=False) for n in range(50)])
    assert kept == [True] * 50
    receiver = bus.receiver(lane, consumer="w1")
    found = await collect(receiver, 50)
    assert sorted(int(d.id) for d in found) == list(range(50))
    await asyncio.gather(*(receiver.ack(d) for d in found))
    await receiver.close()  # sends what is still buffered
    assert await bus.stats(lane) == LaneStats(0, 0, 0)


async def test_retry_comes_back_when_due_with_the_next_attempt(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    [first] = await collect(receiver, 1)
    due_ms = int(time.time() * 1000) + 600
    await receiver.retry(first, due_ms=due_ms, attempts=3)
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)  # no slot held
    while time.time() * 1000 < due_ms - 150:
        assert await receiver.fetch(10) == []
    [again] = await collect(receiver, 1)
    assert time.time() * 1000 >= due_ms
    assert (again.id, again.attempt, again.body) == ("a", 4, first.body)
    assert again.key != first.key  # a new entry
    await receiver.ack(again)
    await receiver.close()
    assert await bus.stats(lane) == LaneStats(0, 0, 0)


async def test_dead_letters_requeue_and_purge(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a", lane.subject), message("b", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    deliveries = await collect(receiver, 2)
    assert [d.id for d in deliveries] == ["a", "b"]
    for delivery in deliveries:
        await receiver.dead_letter(delivery, record(delivery, 5), terminate=False)
        await asyncio.sleep(0.002)  # records of different milliseconds
    assert await bus.stats(lane) == LaneStats(0, 0, 2)  # the jobs are gone
    assert await bus.count_dead(lane) == 2
    listed = await bus.dead_letters(lane, limit=10)
    assert [r["id"] for r in listed] == ["b", "a"]  # newest first
    assert listed[0]["seq"] > listed[1]["seq"]
    assert listed[0]["attempts"] == 5 and listed[0]["error"]["message"] == "boom"
    assert [r["id"] for r in await bus.dead_letters(lane, limit=1)] == ["b"]

    await bus.requeue(lane, listed[1])
    assert await bus.count_dead(lane) == 1
    [requeued] = await collect(receiver, 1)
    assert (requeued.id, requeued.attempt, requeued.body) == ("a", 1, b'{"n":1}')
    await receiver.ack(requeued)

    assert await bus.purge(lane) == 1
    assert await bus.count_dead(lane) == 0
    assert await bus.dead_letters(lane, limit=10) == []
    await receiver.close()
    assert await bus.stats(lane) == LaneStats(0, 0, 0)


async def test_a_dead_letter_not_stored_raises_and_leaves_the_delivery(
    bus: RedisBus, prefix: str
) -> None:
    lane = job_lane(prefix, ack_wait_s=ACK_WAIT_S)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await collect(receiver, 1)
    dlq = lane_keys(lane).dlq
    await bus.native.set(dlq, "not a stream")  # XADD to it fails: WRONGTYPE
    with pytest.raises(DriverUnavailable):
        await receiver.dead_letter(delivery, record(delivery, 1), terminate=False)
    await bus.native.delete(dlq)
    await receiver.release(delivery, delay_s=0.1)
    [again] = await collect(receiver, 1)  # unsettled: it comes back
    assert (again.id, again.attempt, again.key) == ("a", 2, delivery.key)
    await receiver.dead_letter(again, record(again, 2), terminate=True)
    assert await bus.count_dead(lane) == 1
    await receiver.close()


async def test_dedup_drops_a_second_message_with_the_same_id(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    assert await bus.publish(lane, [message("same", lane.subject)]) == [True]
    assert await bus.publish(lane, [message("same", lane.subject)]) == [False]
    receiver = bus.receiver(lane, consumer="w1")
    assert [d.id for d in await collect(receiver, 1)] == ["same"]
    await receiver.close()


async def test_a_delayed_message_waits_for_its_time(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    run_at = int(time.time() * 1000) + 600
    assert await bus.publish(lane, [message("later", lane.subject, run_at_ms=run_at)]) == [True]
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
    receiver = bus.receiver(lane, consumer="w1")
    while time.time() * 1000 < run_at - 150:
        assert await receiver.fetch(10) == []
    [delivery] = await collect(receiver, 1)
    assert time.time() * 1000 >= run_at
    assert (delivery.id, delivery.attempt, delivery.run_at_ms) == ("later", 1, run_at)
    await receiver.ack(delivery)
    await receiver.close()


async def test_an_entry_not_settled_is_reclaimed_after_the_ack_wait(
    bus: RedisBus, prefix: str
) -> None:
    lane = job_lane(prefix, ack_wait_s=ACK_WAIT_S)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a", lane.subject)])
    dead_worker = bus.receiver(lane, consumer="w1")
    [first] = await collect(dead_worker, 1)
    started = time.monotonic()
    peer = bus.receiver(lane, consumer="w2")
    [again] = await collect(peer, 1)
    assert time.monotonic() - started >= ACK_WAIT_S * 0.9
    assert (again.id, again.attempt, again.key) == ("a", 2, first.key)
    await peer.ack(again)
    await peer.close()
    assert await stats_become(bus, lane, LaneStats(0, 0, 0)) == LaneStats(0, 0, 0)


async def test_extend_keeps_a_running_entry_from_peers(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix, ack_wait_s=ACK_WAIT_S)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a", lane.subject)])
    runner = bus.receiver(lane, consumer="w1")
    [delivery] = await collect(runner, 1)
    peer = bus.receiver(lane, consumer="w2")
    deadline = time.monotonic() + ACK_WAIT_S * 4
    next_extend = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_extend:
            await runner.extend(delivery)
            next_extend = time.monotonic() + ACK_WAIT_S / 3
        assert await peer.fetch(10) == []
    await runner.ack(delivery)
    await runner.close()
    assert await peer.fetch(10) == []
    await peer.close()


async def test_release_hands_it_back_after_the_delay(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix, ack_wait_s=30.0)  # far longer than the delay
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await collect(receiver, 1)
    await receiver.release(delivery, delay_s=0.3)
    started = time.monotonic()
    peer = bus.receiver(lane, consumer="w2")
    [again] = await collect(peer, 1)
    assert 0.25 <= time.monotonic() - started < 5
    assert (again.id, again.attempt) == ("a", 2)
    await peer.ack(again)
    await peer.close()


async def test_wake_ends_a_fetch_early(bus: RedisBus, prefix: str) -> None:
    lane = job_lane(prefix)
    await bus.ensure(lane, apply_limits=False)
    receiver = bus.receiver(lane, consumer="w1")
    receiver.wake()  # before a fetch: the next one returns at once
    started = time.monotonic()
    assert await receiver.fetch(1) == []
    assert time.monotonic() - started < 0.05
    # During a fetch: its XREADGROUP runs out its block (200 ms, to Redis's 100 ms clock), and
    # what it got meanwhile is handed back at once rather than delivered (not an attempt).
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, receiver.wake)
    loop.call_later(0.1, lambda: loop.create_task(bus.publish(lane, [message("a", lane.subject)])))
    started = time.monotonic()
    assert await receiver.fetch(1) == []
    assert time.monotonic() - started < 0.45
    [delivery] = await collect(receiver, 1)
    assert (delivery.id, delivery.attempt) == ("a", 1)
    await receiver.close()


async def test_groups_hear_the_events_their_pattern_matches(bus: RedisBus, prefix: str) -> None:
    users = group_lane(f"{prefix}_users", f"{prefix}.user.*")
    everything = group_lane(f"{prefix}_all", f"{prefix}.>")
    await bus.ensure_events(max_age_s=3600)
    for lane in (users, everything):
        await bus.ensure(lane, apply_limits=False)
    names = [
        f"{prefix}.user.signed_up",
        f"{prefix}.order.paid",
        f"{prefix}.user.left",
        f"{prefix}.user.a.b",
    ]
    kept = await bus.emit(
        [message(f"{prefix}-{n}", name) for n, name in enumerate(names)], max_age_s=3600
    )
    assert kept == [True] * 4
    assert await bus.emit([message(f"{prefix}-0", names[0])], max_age_s=3600) == [False]

    heard = {}
    for lane in (users, everything):
        receiver = bus.receiver(lane, consumer="w1")
        deliveries = await collect(receiver, 4 if lane is everything else 2)
        heard[lane.name] = [(d.subject, d.attempt) for d in deliveries]
        for delivery in deliveries:
            await receiver.ack(delivery)
        await receiver.close()
    assert heard[users.name] == [(names[0], 1), (names[2], 1)]
    assert heard[everything.name] == [(name, 1) for name in names]
    for lane in (users, everything):
        stats = await bus.stats(lane)
        assert (stats.in_flight, stats.dlq) == (0, 0)


async def test_a_group_retries_and_dead_letters_on_its_own_stream(
    bus: RedisBus, prefix: str
) -> None:
    lane = group_lane(f"{prefix}_g", f"{prefix}.*")
    await bus.ensure(lane, apply_limits=False)
    await bus.emit([message(f"{prefix}-1", f"{prefix}.x")], max_age_s=0)
    receiver = bus.receiver(lane, consumer="w1")
    [first] = await collect(receiver, 1)
    await receiver.retry(first, due_ms=int(time.time() * 1000), attempts=1)
    [again] = await collect(receiver, 1)
    assert (again.id, again.subject, again.attempt) == (f"{prefix}-1", f"{prefix}.x", 2)
    await receiver.dead_letter(again, record(again, 2), terminate=False)
    [dead] = await bus.dead_letters(lane, limit=5)
    assert (dead["id"], dead["subject"]) == (f"{prefix}-1", f"{prefix}.x")
    await bus.requeue(lane, dead)
    [requeued] = await collect(receiver, 1)
    assert (requeued.subject, requeued.attempt) == (f"{prefix}.x", 1)
    await receiver.ack(requeued)
    await receiver.close()
    assert (await bus.stats(lane)).dlq == 0
    # The log's entry is acknowledged, never deleted: other groups may not have read it. It is
    # the log's newest (the retry and the requeue went to the group's own stream).
    entries: Any = await bus.native.xrevrange(EVENTS_LOG, count=1)
    [(_, newest)] = entries
    assert (newest[b"id"], newest[b"subject"]) == (
        f"{prefix}-1".encode(),
        f"events.{prefix}.x".encode(),
    )


async def test_a_group_ensured_later_replays_the_kept_events(bus: RedisBus, prefix: str) -> None:
    await bus.emit(
        [message(f"{prefix}-{n}", f"{prefix}.user.e{n}") for n in range(3)], max_age_s=3600
    )
    late = group_lane(f"{prefix}_late", f"{prefix}.user.*")
    await bus.ensure(late, apply_limits=False)
    receiver = bus.receiver(late, consumer="w1")
    found = await collect(receiver, 3)
    assert [d.id for d in found] == [f"{prefix}-{n}" for n in range(3)]
    await receiver.close()
