"""What only the memory driver's bus (mega/drivers/memory/bus.py) does: what `stats` counts of
a lane in this process, how its dead letters are found, deleted and made jobs again, and what
its record stores keep and list. What every driver does is the contract suite's
(tests/mega/jobs/test_contract.py); the receiver's part is test_receiver.py's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from mega.drivers.base import Delivery, DlqRecord, Lane, LaneStats, Message
from mega.drivers.memory import MemoryBus, MemoryReceiver
from mega.settings import BusSpec
from tests.mega.drivers.lanes import group_lane, record

DEADLINE_S = 5.0


@pytest.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    made = MemoryBus("jobs", BusSpec(driver="memory"))
    yield made
    await made.close()


def job_lane(keep_result_s: float = 60) -> Lane:
    return Lane(
        "job",
        "app.send",
        "app.send",
        10,
        30.0,
        3600.0,
        keep_status_s=60,
        keep_result_s=keep_result_s,
    )


def sent_at(job_id: str, enqueued_at_ms: int, run_at_ms: int | None = None) -> Message:
    return Message(job_id, "app.send", b'{"n":1}', enqueued_at_ms, run_at_ms, dedup=False)


async def fetch(receiver: MemoryReceiver, count: int) -> list[Delivery]:
    """Fetch until `count` deliveries came."""
    found: list[Delivery] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(found) < count:
        assert time.monotonic() < deadline, f"{len(found)} deliveries, {count} wanted"
        found += await receiver.fetch(count - len(found))
    return found


def dead(job_id: str, subject: str, *, flow_key: str | None = None) -> DlqRecord:
    """A dead letter as the DLQ tools hand one to `requeue` (with a `seq` no record has)."""
    found: DlqRecord = {
        "id": job_id,
        "subject": subject,
        "payload": {"n": 2},
        "error": {"type": "RuntimeError", "message": "boom"},
        "attempts": 3,
        "first_enqueued_at": 1234,
        "failed_at": 5678,
        "worker": "test",
        "seq": 99,
    }
    if flow_key is not None:
        found["flow_key"] = flow_key
    return found


async def test_stats_count_ready_delayed_and_running_and_date_the_oldest_unsettled(
    bus: MemoryBus,
) -> None:
    lane = job_lane()
    now = int(time.time() * 1000)
    jobs = [sent_at("first", now - 2000), sent_at("second", now - 1000)]
    later = sent_at("later", now - 9000, run_at_ms=now + 3_600_000)
    assert await bus.publish(lane, [*jobs, later]) == [True, True, True]
    stats = await bus.stats(lane)
    assert stats == LaneStats(pending=3, in_flight=0, dlq=0)  # the delayed one counted
    assert (stats.oldest_ms, stats.stored) == (now - 2000, 3)  # but not dated
    receiver = bus.receiver(lane, consumer="w1")
    [running] = await fetch(receiver, 1)
    assert running.id == "first"
    stats = await bus.stats(lane)
    assert stats == LaneStats(pending=2, in_flight=1, dlq=0)
    assert (stats.oldest_ms, stats.stored) == (now - 2000, 3)  # the running one is unsettled
    await receiver.dead_letter(running, record(running, 1), terminate=False)
    stats = await bus.stats(lane)
    assert stats == LaneStats(pending=2, in_flight=0, dlq=1)
    assert (stats.oldest_ms, stats.stored) == (now - 1000, 3)


async def test_a_dead_letter_is_found_by_its_id_paged_by_seq_and_deleted_once(
    bus: MemoryBus,
) -> None:
    lane = job_lane()
    now = int(time.time() * 1000)
    await bus.publish(lane, [sent_at("a", now), sent_at("b", now), sent_at("a", now)])
    receiver = bus.receiver(lane, consumer="w1")
    for delivery in await fetch(receiver, 3):
        await receiver.dead_letter(delivery, record(delivery, 2), terminate=False)
    newest = await bus.dead_letter(lane, "a")
    assert newest is not None and (newest["id"], newest["seq"]) == ("a", 3)
    assert await bus.dead_letter(lane, "c") is None
    assert [(r["id"], r["seq"]) for r in await bus.dead_letters(lane, limit=10, before=3)] == [
        ("b", 2),
        ("a", 1),
    ]
    assert await bus.delete_dead(lane, 2) is True
    assert await bus.delete_dead(lane, 2) is False
    assert [r["seq"] for r in await bus.dead_letters(lane, limit=10)] == [3, 1]
    assert await bus.count_dead(lane) == 2


async def test_a_requeued_dead_letter_is_a_new_job_made_from_its_record(bus: MemoryBus) -> None:
    lane = job_lane()
    await bus.requeue(lane, dead("gone", lane.subject, flow_key="tenant-1"))
    receiver = bus.receiver(lane, consumer="w1")
    [again] = await fetch(receiver, 1)
    # One no longer kept is requeued all the same: its payload, first enqueue and key.
    assert (again.id, again.subject, again.body, again.attempt) == (
        "gone",
        "app.send",
        b'{"n":2}',
        1,
    )
    assert (again.enqueued_at_ms, again.flow_key) == (1234, "tenant-1")
    await receiver.dead_letter(again, record(again, 1), terminate=False)
    [kept] = await bus.dead_letters(lane, limit=10)
    del kept["seq"]
    await bus.requeue(lane, kept)  # without its seq: found by its id
    assert await bus.count_dead(lane) == 0
    assert [d.id for d in await fetch(receiver, 1)] == ["gone"]


async def test_a_groups_requeue_names_the_event_without_the_nats_subjects_prefix(
    bus: MemoryBus,
) -> None:
    lane = group_lane("g", "user.*")
    await bus.ensure(lane, apply_limits=False)
    await bus.requeue(lane, dead("e1", "events.user.signed_up"))
    receiver = bus.receiver(lane, consumer="w1")
    [again] = await fetch(receiver, 1)
    assert (again.id, again.subject, again.body) == ("e1", "user.signed_up", b'{"n":2}')


async def test_records_are_listed_while_kept_and_a_table_kept_0_s_keeps_none(
    bus: MemoryBus,
) -> None:
    lane = job_lane(keep_result_s=0)
    written = await bus.put_records(lane, "status", [("a", b"1"), ("b", b"2")], create=False)
    assert written == [True, True]
    assert await bus.put_records(lane, "result", [("a", b"r")], create=False) == [True]
    assert await bus.list_records(lane, "status") == [("a", b"1"), ("b", b"2")]
    assert await bus.list_records(lane, "result") == []
    assert await bus.get_records(lane, "result", ["a"]) == [None]
    assert await bus.put_records(lane, "result", [("a", b"again")], create=True) == [True]
