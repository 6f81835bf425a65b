"""What only the nats driver's bus (mega/drivers/nats/bus.py) does, on the session's nats-server:
the streams and the consumer `ensure` makes for a lane, and what it leaves as it found it; the
consumer's cap that `window_safe` reads; what `publish` stores and drops as a duplicate, and
where it keeps a fair lane's jobs; what `stats` counts on JetStream. What every driver does is
the contract suite's (tests/mega/jobs/test_contract.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, RetentionPolicy, StorageType

from mega.drivers.base import DEDUP_WINDOW_S, Delivery, DriverUnavailable, Lane, LaneStats, Message
from mega.drivers.nats import core as core_module
from mega.drivers.nats import events as events_module
from mega.drivers.nats.bus import NatsBus
from mega.drivers.nats.names import (
    EVENTS_STREAM,
    JOB_CONSUMER,
    dlq_stream_of,
    fair_stream_of,
    stream_of,
)
from mega.drivers.nats.receiver import NatsReceiver
from tests.mega.drivers.lanes import message, record

DEADLINE_S = 10.0


def job_lane(prefix: str, concurrency: int = 4, *, fair: bool = False) -> Lane:
    return Lane("job", f"{prefix}_bus", f"{prefix}.bus", concurrency, 7.0, 3600.0, fair=fair)


def sent_at(job_id: str, subject: str, enqueued_at_ms: int, *, dedup: bool = True) -> Message:
    return Message(job_id, subject, b'{"n":1}', enqueued_at_ms, dedup=dedup)


async def stats_become(nats_bus: NatsBus, lane: Lane, wanted: LaneStats) -> LaneStats:
    """The lane's stats once they equal `wanted` (settles reach the server on their own)."""
    deadline = time.monotonic() + DEADLINE_S
    while (stats := await nats_bus.stats(lane)) != wanted:
        assert time.monotonic() < deadline, f"{stats}, {wanted} wanted"
        await asyncio.sleep(0.02)
    return stats


async def fetch_one(receiver: NatsReceiver) -> Delivery:
    """The one delivery a fetch hands out (fetching until it comes)."""
    deadline = time.monotonic() + DEADLINE_S
    while not (found := await receiver.fetch(1)):
        assert time.monotonic() < deadline, "no delivery came"
    [delivery] = found
    return delivery


async def test_ensure_makes_the_work_stream_the_dead_letters_and_the_bound_consumer(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix)
    await nats_bus.ensure(lane, apply_limits=False)
    work = (await nats_bus.js.stream_info(stream_of(lane))).config
    assert work.subjects == [lane.subject, f"{lane.subject}._delay.*"]
    assert (work.retention, work.storage) == (RetentionPolicy.WORK_QUEUE, StorageType.FILE)
    assert (work.duplicate_window, work.num_replicas, work.allow_msg_schedules) == (
        DEDUP_WINDOW_S,
        1,
        True,
    )
    dead = (await nats_bus.js.stream_info(dlq_stream_of(lane))).config
    assert dead.subjects == [f"{lane.subject}.dlq", f"{lane.subject}.dlq.>"]
    assert (dead.retention, dead.max_age) == (RetentionPolicy.LIMITS, 3600)
    consumer = (await nats_bus.js.consumer_info(stream_of(lane), JOB_CONSUMER)).config
    assert (consumer.durable_name, consumer.filter_subject) == (JOB_CONSUMER, lane.subject)
    assert (consumer.ack_policy, consumer.ack_wait, consumer.max_ack_pending) == (
        AckPolicy.EXPLICIT,
        7,
        4,
    )
    assert consumer.max_deliver == -1  # the consume loop decides when a job is dead


async def test_ensure_again_changes_no_stream_and_keeps_the_consumer(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix)
    await nats_bus.ensure(lane, apply_limits=False)
    before = await nats_bus.js.consumer_info(stream_of(lane), JOB_CONSUMER)
    # An operator's limit on the work stream: a stream's limits are never the lane's to change.
    config = (await nats_bus.js.stream_info(stream_of(lane))).config
    await nats_bus.js.update_stream(dataclasses.replace(config, max_msgs=1000))
    assert await nats_bus.publish(lane, [message(f"{prefix}-1", lane.subject)]) == [True]
    for apply_limits in (False, True):
        await nats_bus.ensure(lane, apply_limits=apply_limits)
        work = await nats_bus.js.stream_info(stream_of(lane))
        assert (work.config.max_msgs, work.state.messages) == (1000, 1)
        after = await nats_bus.js.consumer_info(stream_of(lane), JOB_CONSUMER)
        assert after.created == before.created and after.config == before.config
    assert await nats_bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)


async def test_window_safe_says_whether_the_consumer_runs_with_the_lanes_concurrency(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix, concurrency=4)
    assert not nats_bus.window_safe(lane)  # never ensured: nothing known of its consumer
    await nats_bus.ensure(lane, apply_limits=False)
    assert nats_bus.window_safe(lane)
    bigger = dataclasses.replace(lane, concurrency=8)
    await nats_bus.ensure(bigger, apply_limits=False)  # the running cap of 4 is kept
    consumer = (await nats_bus.js.consumer_info(stream_of(lane), JOB_CONSUMER)).config
    assert consumer.max_ack_pending == 4
    assert not nats_bus.window_safe(bigger)
    await nats_bus.ensure(bigger, apply_limits=True)
    consumer = (await nats_bus.js.consumer_info(stream_of(lane), JOB_CONSUMER)).config
    assert consumer.max_ack_pending == 8
    assert nats_bus.window_safe(bigger)


async def test_publish_drops_an_id_seen_inside_the_window_and_keeps_one_not_given(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix)
    await nats_bus.ensure(lane, apply_limits=False)
    now = int(time.time() * 1000)
    assert await nats_bus.publish(lane, [sent_at("a", lane.subject, now)]) == [True]
    assert await nats_bus.publish(lane, [sent_at("a", lane.subject, now)]) == [False]
    pipelined = [
        sent_at("b", lane.subject, now),
        sent_at("b", lane.subject, now),
        sent_at("c", lane.subject, now, dedup=False),  # no Nats-Msg-Id: never a duplicate
        sent_at("c", lane.subject, now, dedup=False),
    ]
    assert await nats_bus.publish(lane, pipelined) == [True, False, True, True]
    assert (await nats_bus.js.stream_info(stream_of(lane))).state.messages == 4
    stats = await nats_bus.stats(lane)
    assert stats == LaneStats(pending=4, in_flight=0, dlq=0)
    assert (stats.stored, stats.oldest_ms) == (4, now)


async def test_stats_count_jobs_waiting_running_dead_and_scheduled_ones_only_as_stored(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix, concurrency=1)  # the consumer hands out one at a time
    await nats_bus.ensure(lane, apply_limits=False)
    now = int(time.time() * 1000)
    jobs = [sent_at(f"{prefix}-{n}", lane.subject, now - 3000 + n * 1000) for n in range(3)]
    assert await nats_bus.publish(lane, jobs) == [True, True, True]
    later = Message(f"{prefix}-later", lane.subject, b"{}", now, run_at_ms=now + 3_600_000)
    assert await nats_bus.publish(lane, [later]) == [True]
    # The delayed job waits as a schedule on its own subject: stored, not pending.
    stats = await nats_bus.stats(lane)
    assert stats == LaneStats(pending=3, in_flight=0, dlq=0)
    assert (stats.stored, stats.oldest_ms) == (4, now - 3000)

    receiver = nats_bus.receiver(lane, consumer="test")
    try:
        running = await fetch_one(receiver)
        assert running.id == f"{prefix}-0"
        stats = await stats_become(nats_bus, lane, LaneStats(pending=2, in_flight=1, dlq=0))
        assert stats.oldest_ms == now - 3000  # the running one is the oldest unsettled
        await receiver.dead_letter(running, record(running, 1), terminate=True)
        stats = await stats_become(nats_bus, lane, LaneStats(pending=2, in_flight=0, dlq=1))
        assert (stats.stored, stats.oldest_ms) == (4, now - 2000)
    finally:
        await receiver.close()


async def test_a_fair_lanes_jobs_wait_on_their_keys_subjects_and_count_as_pending(
    nats_bus: NatsBus, prefix: str
) -> None:
    lane = job_lane(prefix, fair=True)
    await nats_bus.ensure(lane, apply_limits=False)
    fair = (await nats_bus.js.stream_info(fair_stream_of(lane))).config
    assert fair.subjects == [f"{lane.subject}._fair.*"]
    assert (fair.retention, fair.allow_direct) == (RetentionPolicy.LIMITS, True)
    now = int(time.time() * 1000)
    jobs = [
        dataclasses.replace(sent_at(f"{prefix}-{n}", lane.subject, now), flow_key=key)
        for n, key in enumerate(["a", "a", "b"])
    ]
    assert await nats_bus.publish(lane, jobs) == [True, True, True]
    # None on the work stream until a receiver feeds it, a job of each key in turn (fair.py).
    waiting = await nats_bus.js.stream_info(fair_stream_of(lane), subjects_filter=">")
    assert waiting.state.subjects == {f"{lane.subject}._fair.a": 2, f"{lane.subject}._fair.b": 1}
    assert (await nats_bus.js.stream_info(stream_of(lane))).state.messages == 0
    assert await nats_bus.stats(lane) == LaneStats(pending=3, in_flight=0, dlq=0)


async def test_setting_the_events_up_asks_again_when_jetstream_answers_late(
    nats_bus: NatsBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster electing the events stream's leader answers a worker's set-up late: the
    set-up asks again (as a lane's does) instead of failing the worker's start, and gives up
    with DriverUnavailable only after ENSURE_ATTEMPTS late answers. (It gave up at the first,
    and a worker started during an election exited.)"""
    calls: list[str] = []
    real = core_module.ensure_stream

    async def late_then_real(js: Any, config: Any) -> None:
        calls.append(config.name)
        if len(calls) < late:
            raise NatsTimeoutError
        await real(js, config)

    monkeypatch.setattr(events_module, "ensure_stream", late_then_real)
    monkeypatch.setattr(core_module, "ENSURE_PAUSE_S", 0.0)
    late = core_module.ENSURE_ATTEMPTS  # the last ask is answered
    await nats_bus.ensure_events(max_age_s=3600)
    assert calls == [EVENTS_STREAM] * core_module.ENSURE_ATTEMPTS
    calls.clear()
    late = core_module.ENSURE_ATTEMPTS + 1  # never answered in time
    with pytest.raises(DriverUnavailable):
        await nats_bus.ensure_events(max_age_s=3600)
    assert len(calls) == core_module.ENSURE_ATTEMPTS
