"""The nats driver on a node that goes silent (SIGSTOP: no reset, no close, no answer) in a real
three-node cluster: the client leaves it within seconds for a healthy node, and the acks it
wrote to the silent connection, which never arrived, are sent again on the new one, so the
group's slots are free at once instead of after the ack wait."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import generate_latest

from mega.drivers.base import Lane
from mega.drivers.nats.bus import NatsBus
from mega.drivers.nats.names import durable_of, stream_of
from mega.runtime.metrics import observe_buses
from mega.settings import BusSpec
from tests.cluster import NatsCluster
from tests.mega.drivers.lanes import message

pytestmark = pytest.mark.slow

ACK_WAIT_S = 30.0  # the default: only a re-sent ack frees a slot before it


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float) -> float:
    """Seconds until `check()` holds; fails after `timeout_s`."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_acks_lost_on_a_frozen_node_are_sent_again_on_the_next(
    cluster: NatsCluster, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    lane = Lane("job", f"{prefix}-silent", f"{prefix}.silent", 4, ACK_WAIT_S, 60.0, replicas=3)
    observer = await NatsBus.connect("watch", BusSpec(driver="nats", url=cluster.url))
    await observer.ensure(lane, apply_limits=True)
    stream, durable = stream_of(lane), durable_of(lane)
    leader = (await observer.js.consumer_info(stream, durable)).cluster.leader  # type: ignore[union-attr]
    # The worker's client starts on a node that leads nothing of this lane, so freezing it
    # costs no election: what is measured is the client's move and its acks.
    frozen = next(node for node in cluster.nodes if node.server_name != leader)
    bus = await NatsBus.connect("jobs", BusSpec(driver="nats", url=frozen.url))
    receiver = bus.receiver(lane, consumer="test")
    assert frozen.process is not None
    try:
        await bus.publish(lane, [message(f"{prefix}-{n}", lane.subject) for n in range(4)])
        deliveries = await receiver.fetch(4)
        while len(deliveries) < 4:
            deliveries += await receiver.fetch(4 - len(deliveries))

        async def pending() -> int:
            info = await observer.js.consumer_info(stream, durable)
            return int(info.num_ack_pending)

        assert await pending() == 4  # every slot of the group is held
        caplog.set_level(logging.INFO, logger="mega.jobqueue")
        os.kill(frozen.process.pid, signal.SIGSTOP)
        try:
            for delivery in deliveries:  # written to a connection nobody reads any more
                await receiver.ack(delivery)
            moved_s = await until(
                lambda: _true(bus.connected and bus.disconnects == 1),
                "the client to leave the frozen node",
                10,
            )
            assert moved_s < 6, moved_s  # three unanswered pings a second apart, then the move
            freed_s = await until(lambda: _is(pending(), 0), "the slots to be free", 10)
        finally:
            os.kill(frozen.process.pid, signal.SIGCONT)
        assert freed_s < ACK_WAIT_S / 3, freed_s
        assert f"lost {frozen.url.removeprefix('nats://')}; moving to another node" in caplog.text
        assert "4 settle(s) sent again after the reconnect" in caplog.text
        assert (await observer.stats(lane)).pending == 0  # acked: gone from the work queue
        observe_buses({"jobs": bus})
        assert 'mega_bus_disconnects_total{bus="jobs"} 1.0' in generate_latest().decode()
    finally:
        await receiver.close()
        await bus.close()
        await observer.close()


async def _true(value: bool) -> bool:
    return value


async def _is(count: Awaitable[int], wanted: int) -> bool:
    return await count == wanted
