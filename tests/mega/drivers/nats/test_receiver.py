"""The nats driver's receiver (mega/drivers/nats/receiver.py) and its pull requests, on the
session's nats-server: a waiting request is kept by the server's idle heartbeats, and one that
hears nothing (asked of a consumer without a leader, or of a node gone silent) is made again
after PULL_SILENT_S instead of after its expiry."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from mega.drivers.base import Delivery, Lane
from mega.drivers.nats import bus as bus_module
from mega.drivers.nats.bus import NatsBus
from mega.drivers.nats.names import durable_of, stream_name
from mega.drivers.nats.receiver import (
    PULL_EXPIRES_S,
    PULL_GRACE_S,
    PULL_HEARTBEAT_S,
    PULL_SILENT_S,
    NatsReceiver,
)
from tests.mega.drivers.lanes import message

DEADLINE_S = 10.0


async def lane_of(nats_bus: NatsBus, prefix: str, concurrency: int = 4) -> Lane:
    lane = Lane("job", f"{prefix}-pulls", f"{prefix}.pulls", concurrency, 30.0, 60.0)
    await nats_bus.ensure(lane, apply_limits=True)
    return lane


async def pulls_of(nats_bus: NatsBus, receiver: NatsReceiver) -> list[float]:
    """When each pull request of `receiver` was sent (monotonic s): a plain subscriber to the
    request subject gets a copy of each, beside JetStream's own."""
    sent: list[float] = []

    async def seen(_msg: Msg) -> None:
        sent.append(time.monotonic())

    await nats_bus.native.subscribe(receiver.pull_subject, cb=seen)
    await nats_bus.native.flush()
    return sent


async def counted(sent: list[float], n: int) -> int:
    """How many of `sent` there are once at least `n` have come (the copies are delivered
    on their own task)."""
    deadline = time.monotonic() + DEADLINE_S
    while len(sent) < n:
        assert time.monotonic() < deadline, f"{len(sent)} pull(s) seen, {n} wanted"
        await asyncio.sleep(0.01)
    return len(sent)


async def idle_until(receiver: NatsReceiver, heard: int) -> int:
    """Fetch (nothing comes) until the receiver has heard `heard` idle heartbeats; returns how
    many it heard."""
    count, last = 0, receiver.heard_at
    deadline = time.monotonic() + DEADLINE_S
    while count < heard:
        assert time.monotonic() < deadline, f"{count} idle heartbeats in {DEADLINE_S:g} s"
        assert await receiver.fetch(4) == []
        if receiver.heard_at != last:
            count, last = count + 1, receiver.heard_at
    return count


async def test_a_waiting_pull_is_kept_by_the_servers_heartbeats_not_made_again(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = await lane_of(nats_bus, prefix)
    receiver = nats_bus.receiver(lane, consumer="test")
    sent = await pulls_of(nats_bus, receiver)
    try:
        # Past PULL_SILENT_S of idling, with no message: the heartbeats keep the one request.
        heard = await idle_until(receiver, heard=round(PULL_SILENT_S / PULL_HEARTBEAT_S) + 1)
        assert heard >= 3 and await counted(sent, 1) == 1, sent
        await nats_bus.publish(lane, [message(f"{prefix}-1", lane.subject)])
        deliveries = await receiver.fetch(4)
        assert [d.id for d in deliveries] == [f"{prefix}-1"] and await counted(sent, 1) == 1
    finally:
        await receiver.close()


async def test_a_pull_held_while_every_slot_is_taken_still_hears_its_heartbeats(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = await lane_of(nats_bus, prefix, concurrency=2)
    receiver = nats_bus.receiver(lane, consumer="test")
    sent = await pulls_of(nats_bus, receiver)
    try:
        await nats_bus.publish(lane, [message(f"{prefix}-{n}", lane.subject) for n in range(2)])
        held: list[Delivery] = []
        while len(held) < 2:
            held += await receiver.fetch(2)
        # Both slots unacked: the consumer's max_ack_pending holds the next request back.
        await idle_until(receiver, heard=1)  # the pulls of the fetches above are all made
        pulls = len(sent)
        await idle_until(receiver, heard=round(PULL_SILENT_S / PULL_HEARTBEAT_S) + 1)
        assert len(sent) == pulls, sent
    finally:
        await receiver.close()


async def test_a_pull_that_hears_nothing_is_made_again_before_it_would_expire(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = await lane_of(nats_bus, prefix)
    receiver = nats_bus.receiver(lane, consumer="test")
    # A subject nobody answers: a request there hears nothing, as one asked of a consumer
    # without a leader does. The receiver's clock is driven: `_top_up` takes `now`.
    receiver.pull_subject = f"{prefix}.nobody"
    sent = await pulls_of(nats_bus, receiver)
    try:
        start = time.monotonic()
        await receiver._top_up(4, start)
        await receiver._top_up(4, start + PULL_SILENT_S - 0.1)
        await nats_bus.native.flush()
        assert await counted(sent, 1) == 1 and receiver.credits == 4
        await receiver._top_up(4, start + PULL_SILENT_S + 0.1)  # silent too long: gone
        assert await counted(sent, 2) == 2 and receiver.credits == 4
        assert PULL_SILENT_S + 0.1 < PULL_EXPIRES_S + PULL_GRACE_S  # sooner than the expiry
    finally:
        await receiver.close()


async def first_fetched(receiver: NatsReceiver) -> list[str]:
    """The ids of the first fetch that brings anything: the consumer made again."""
    deadline = time.monotonic() + 3 * DEADLINE_S
    while not (got := [delivery.id for delivery in await receiver.fetch(4)]):
        assert time.monotonic() < deadline, "the consumer was never made again"
    return got


async def test_a_pull_to_a_deleted_consumer_makes_it_again_and_the_jobs_come(
    nats_bus: NatsBus, prefix: str
) -> None:
    """Deleted between two pulls, the consumer has no one to answer the next one: the server
    says 503 (no responders), not 409. The receiver makes the consumer again on that answer
    too, and the job published meanwhile is delivered."""
    lane = await lane_of(nats_bus, prefix)
    receiver = nats_bus.receiver(lane, consumer="test")
    try:
        await nats_bus.publish(lane, [message(f"{prefix}-1", lane.subject)])
        [first] = await receiver.fetch(4)
        await receiver.ack(first)
        await receiver.close()  # no pull waiting: the next one meets no consumer
        await nats_bus.js.delete_consumer(receiver.stream, durable_of(lane))
        receiver = nats_bus.receiver(lane, consumer="test")
        await nats_bus.publish(lane, [message(f"{prefix}-2", lane.subject)])
        assert await first_fetched(receiver) == [f"{prefix}-2"]
    finally:
        await receiver.close()


async def test_a_consumer_is_made_again_while_its_dead_letters_cannot_be_reached(
    nats_bus: NatsBus, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane's dead-letter stream and record buckets, single copies on a cluster node that
    is down, answer nothing: making the consumer again asks nothing of them, so the lane is
    served. (It asked, and the lane was never served again.)"""
    lane = await lane_of(nats_bus, prefix)

    async def unreachable(*_args: object, **_kwargs: object) -> None:
        raise NatsTimeoutError

    monkeypatch.setattr(bus_module, "ensure_dlq_stream", unreachable)
    monkeypatch.setattr(bus_module, "ensure_buckets", unreachable)
    await nats_bus.js.delete_consumer(stream_name(lane.subject), durable_of(lane))
    receiver = nats_bus.receiver(lane, consumer="test")
    try:
        await nats_bus.publish(lane, [message(f"{prefix}-1", lane.subject)])
        assert await first_fetched(receiver) == [f"{prefix}-1"]
    finally:
        await receiver.close()
