"""The memory driver through `Bus` and `Receiver` alone (no JobQueue, no EventBus)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from mega.drivers.base import Delivery, DlqRecord, DriverUnavailable, Lane, LaneStats
from mega.drivers.memory import MemoryBroker, MemoryBus, MemoryLane, MemoryReceiver
from mega.settings import BusSpec
from tests.mega.drivers.lanes import group_lane, message, record


@pytest.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    connected = await MemoryBus.connect("jobs", BusSpec(driver="memory"))
    yield connected
    await connected.close()


def job_lane(subject: str = "app.send") -> Lane:
    return Lane("job", subject, subject, 10, 30.0, 3600.0)


async def collect(receiver: MemoryReceiver, count: int, timeout_s: float = 5.0) -> list[Delivery]:
    """Fetch until `count` deliveries came (or the deadline), then check that no more come."""
    found: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        found += await receiver.fetch(count - len(found))
    receiver.wake()  # one more round, at once: nothing beyond `count`
    found += await receiver.fetch(10)
    found += await receiver.fetch(0)
    return found


async def fetch_until(receiver: MemoryReceiver, until_ms: int) -> list[Delivery]:
    """What fetches get until `until_ms` (epoch ms): the last one is woken then."""
    loop = asyncio.get_running_loop()
    handle = loop.call_later(until_ms / 1000 - time.time(), receiver.wake)
    found: list[Delivery] = []
    while time.time() * 1000 < until_ms:
        found += await receiver.fetch(10)
    handle.cancel()
    return found


async def test_connect_says_nothing_outlives_the_process(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        bus = await MemoryBus.connect("jobs", BusSpec(driver="memory"))
    assert "bus 'jobs' is in memory: its jobs and events live and die" in caplog.text
    assert MemoryBus.driver == "memory" and bus.connected
    assert isinstance(bus.native, MemoryBroker)
    assert (await MemoryBus.connect("jobs", BusSpec(driver="memory"))).native is not bus.native
    await bus.ping()


async def test_publish_fetch_ack(bus: MemoryBus) -> None:
    lane = job_lane()
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
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=1, dlq=0)
    assert bus.native.busy()
    await receiver.ack(delivery)
    await receiver.ack(delivery)  # a second settling call does nothing
    assert await bus.stats(lane) == LaneStats(0, 0, 0)
    assert not bus.native.busy()
    await receiver.close()


async def test_retry_comes_back_when_due_with_the_next_attempt(bus: MemoryBus) -> None:
    lane = job_lane()
    await bus.publish(lane, [message("a", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    [first] = await collect(receiver, 1)
    due_ms = int(time.time() * 1000) + 300
    await receiver.retry(first, due_ms=due_ms, attempts=3)
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
    assert await fetch_until(receiver, due_ms - 150) == []
    [again] = await collect(receiver, 1)
    assert time.time() * 1000 >= due_ms - 5  # the loop's timer, not the wall clock
    assert (again.id, again.attempt, again.key) == ("a", 4, first.key)
    await receiver.release(again, delay_s=0)
    [after_release] = await collect(receiver, 1)
    assert after_release.attempt == 5
    await receiver.ack(after_release)
    assert await bus.stats(lane) == LaneStats(0, 0, 0)


async def test_fast_forward_makes_every_waiting_message_due(bus: MemoryBus) -> None:
    lane = job_lane()
    later = int(time.time() * 1000) + 3_600_000
    await bus.publish(lane, [message("a", lane.subject, run_at_ms=later)])
    receiver = bus.receiver(lane, consumer="w1")
    receiver.wake()
    assert await receiver.fetch(10) == []
    assert bus.native.busy()
    bus.native.fast_forward()
    [delivery] = await collect(receiver, 1)
    assert (delivery.id, delivery.run_at_ms) == ("a", later)
    await receiver.ack(delivery)
    assert not bus.native.busy()


async def test_dead_letters_requeue_and_purge(bus: MemoryBus) -> None:
    lane = job_lane()
    await bus.publish(lane, [message("a", lane.subject), message("b", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    deliveries = await collect(receiver, 2)
    assert [d.id for d in deliveries] == ["a", "b"]
    for delivery in deliveries:
        await receiver.dead_letter(delivery, record(delivery, 5), terminate=False)
    assert await bus.stats(lane) == LaneStats(0, 0, 2)
    assert await bus.count_dead(lane) == 2
    listed = await bus.dead_letters(lane, limit=10)
    assert [(r["id"], r["seq"]) for r in listed] == [("b", 2), ("a", 1)]  # newest first
    assert listed[0]["attempts"] == 5 and listed[0]["error"]["message"] == "boom"
    assert [r["id"] for r in await bus.dead_letters(lane, limit=1)] == ["b"]

    await bus.requeue(lane, listed[1])
    assert [r["id"] for r in await bus.dead_letters(lane, limit=10)] == ["b"]
    [requeued] = await collect(receiver, 1)
    assert (requeued.id, requeued.attempt, requeued.body) == ("a", 1, b'{"n":1}')
    await receiver.ack(requeued)

    assert await bus.purge(lane) == 1
    assert await bus.count_dead(lane) == 0
    assert await bus.stats(lane) == LaneStats(0, 0, 0)


async def test_a_dead_letter_not_stored_raises_and_leaves_the_delivery(
    bus: MemoryBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What mega.testing's failing_dlq does: MemoryLane.dead_letter raises."""
    lane = job_lane()
    await bus.publish(lane, [message("a", lane.subject)])
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await collect(receiver, 1)

    def failing(self: MemoryLane, record: DlqRecord) -> None:
        raise ConnectionError("injected DLQ publish failure")

    with monkeypatch.context() as patch:
        patch.setattr(MemoryLane, "dead_letter", failing)
        with pytest.raises(DriverUnavailable, match="injected DLQ publish failure"):
            await receiver.dead_letter(delivery, record(delivery, 1), terminate=False)
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=1, dlq=0)  # unsettled
    await receiver.release(delivery, delay_s=0.05)
    [again] = await collect(receiver, 1)
    assert (again.id, again.attempt, again.key) == ("a", 2, delivery.key)
    await receiver.dead_letter(again, record(again, 1), terminate=True)
    assert await bus.stats(lane) == LaneStats(0, 0, 1)


async def test_dedup_drops_a_second_message_with_the_same_id(bus: MemoryBus) -> None:
    lane = job_lane()
    assert await bus.publish(lane, [message("same", lane.subject)]) == [True]
    assert await bus.publish(lane, [message("same", lane.subject)]) == [False]
    assert await bus.publish(lane, [message("x", lane.subject, dedup=False)] * 2) == [True, True]
    receiver = bus.receiver(lane, consumer="w1")
    assert [d.id for d in await collect(receiver, 3)] == ["same", "x", "x"]


async def test_a_delayed_message_waits_for_its_time(bus: MemoryBus) -> None:
    lane = job_lane()
    run_at = int(time.time() * 1000) + 300
    assert await bus.publish(lane, [message("later", lane.subject, run_at_ms=run_at)]) == [True]
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
    receiver = bus.receiver(lane, consumer="w1")
    assert await fetch_until(receiver, run_at - 150) == []
    [delivery] = await collect(receiver, 1)
    assert (delivery.id, delivery.attempt, delivery.run_at_ms) == ("later", 1, run_at)


async def test_fetch_honours_its_limit_and_close_hands_back(bus: MemoryBus) -> None:
    lane = job_lane()
    await bus.publish(lane, [message(str(n), lane.subject) for n in range(5)])
    receiver = bus.receiver(lane, consumer="w1")
    assert [d.id for d in await receiver.fetch(2)] == ["0", "1"]
    await receiver.close()  # never settled: first in line again, their delivery counted
    other = bus.receiver(lane, consumer="w2")
    found = await collect(other, 5)
    assert [(d.id, d.attempt) for d in found] == [("0", 2), ("1", 2), ("2", 1), ("3", 1), ("4", 1)]


async def test_wake_ends_a_fetch_early(bus: MemoryBus) -> None:
    receiver = bus.receiver(job_lane(), consumer="w1")
    asyncio.get_running_loop().call_later(0.05, receiver.wake)
    started = time.monotonic()
    assert await receiver.fetch(1) == []
    assert time.monotonic() - started < 0.3
    started = time.monotonic()
    assert await receiver.fetch(1) == []  # not woken: the whole wait
    assert 0.4 <= time.monotonic() - started < 1


async def test_groups_hear_the_events_their_pattern_matches(bus: MemoryBus) -> None:
    users, everything = group_lane("users", "user.*"), group_lane("all", ">")
    await bus.ensure_events(max_age_s=3600)
    for lane in (users, everything):
        await bus.ensure(lane, apply_limits=False)
    names = ["user.signed_up", "order.paid", "user.left", "user.a.b"]
    kept = await bus.emit([message(f"e{n}", name) for n, name in enumerate(names)], max_age_s=0)
    assert kept == [True] * 4
    assert await bus.emit([message("e0", names[0])], max_age_s=0) == [False]
    heard = {}
    for lane in (users, everything):
        receiver = bus.receiver(lane, consumer="w1")
        deliveries = await collect(receiver, 4 if lane is everything else 2)
        heard[lane.name] = [(d.subject, d.attempt) for d in deliveries]
        for delivery in deliveries:
            await receiver.ack(delivery)
        assert await bus.stats(lane) == LaneStats(0, 0, 0)
    assert heard["users"] == [("user.signed_up", 1), ("user.left", 1)]
    assert heard["all"] == [(name, 1) for name in names]


async def test_a_group_ensured_later_replays_the_kept_events(bus: MemoryBus) -> None:
    await bus.emit([message(f"e{n}", f"user.e{n}") for n in range(3)], max_age_s=0)
    await bus.emit([message("o", "order.paid")], max_age_s=0)
    late = group_lane("late", "user.*")
    await bus.ensure(late, apply_limits=False)
    await bus.ensure(late, apply_limits=False)  # once
    receiver = bus.receiver(late, consumer="w1")
    found = await collect(receiver, 3)
    assert [d.id for d in found] == ["e0", "e1", "e2"]


async def test_a_group_requeues_its_dead_letters(bus: MemoryBus) -> None:
    lane = group_lane("g", "user.*")
    await bus.ensure(lane, apply_limits=False)
    await bus.emit([message("e1", "user.x")], max_age_s=0)
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await collect(receiver, 1)
    await receiver.dead_letter(delivery, record(delivery, 1), terminate=False)
    [dead] = await bus.dead_letters(lane, limit=5)
    await bus.requeue(lane, dead)
    [again] = await collect(receiver, 1)
    assert (again.id, again.subject, again.attempt) == ("e1", "user.x", 1)
