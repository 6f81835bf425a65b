"""The `postgres` bus driver through `Bus` and `Receiver`, on a real PostgreSQL (conftest.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from mega.database import Database
from mega.drivers import find_driver
from mega.drivers.base import (
    Delivery,
    DlqRecord,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
    Receiver,
)
from mega.drivers.embedded import free_port
from mega.drivers.postgres import PostgresBus, schema, sql
from mega.drivers.postgres import receiver as receiver_module
from mega.drivers.postgres.common import lane_key
from mega.errors import DependencyUnavailable
from mega.runtime.migrate import upgrade
from mega.settings import BusSpec


def now_ms() -> int:
    return int(time.time() * 1000)


def job_lane(subject: str = "demo.email", *, ack_wait_s: float = 30.0, **more: Any) -> Lane:
    return Lane(
        kind="job",
        name=subject,
        subject=subject,
        concurrency=10,
        ack_wait_s=ack_wait_s,
        dlq_max_age_s=more.pop("dlq_max_age_s", 0),
        **more,
    )


def group_lane(name: str, pattern: str, *, ack_wait_s: float = 30.0) -> Lane:
    return Lane(
        kind="group",
        name=name,
        subject=pattern,
        concurrency=10,
        ack_wait_s=ack_wait_s,
        dlq_max_age_s=0,
    )


def message(job_id: str, *, subject: str = "demo.email", **more: Any) -> Message:
    return Message(
        id=job_id,
        subject=subject,
        body=f'{{"n":"{job_id}"}}'.encode(),
        enqueued_at_ms=now_ms(),
        **more,
    )


def record(delivery: Delivery, error: str = "boom") -> DlqRecord:
    return DlqRecord(
        id=delivery.id,
        subject=delivery.subject,
        payload={"n": delivery.id},
        error={"type": "RuntimeError", "message": error},
        attempts=delivery.attempt,
        first_enqueued_at=delivery.enqueued_at_ms,
        failed_at=now_ms(),
        worker="test",
    )


async def fetch_until(receiver: Receiver, count: int, timeout_s: float = 10.0) -> list[Delivery]:
    """Fetch until `count` deliveries came (or the deadline: then what came)."""
    found: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < count and time.monotonic() < deadline:
        found += await receiver.fetch(count - len(found))
    return found


@pytest.fixture
async def bus(postgres_url: str) -> AsyncIterator[PostgresBus]:
    connected = await PostgresBus.connect("jobs", BusSpec(driver="postgres", url=postgres_url))
    yield connected
    await connected.close()


@pytest.fixture
async def lane(bus: PostgresBus) -> Lane:
    made = job_lane()
    await bus.ensure(made, apply_limits=False)
    return made


def test_the_registry_finds_the_driver() -> None:
    assert find_driver("postgres") is PostgresBus


def test_a_bus_spec_takes_a_postgres_url() -> None:
    for url in ("postgresql://u:p@db:5432/app", "postgres://db/app"):
        assert BusSpec(driver="postgres", url=url).url == url
    with pytest.raises(ValueError, match="expected postgresql/postgres://"):
        BusSpec(driver="postgres", url="redis://db:6379")


def test_the_pattern_regex_matches_like_nats() -> None:
    import re

    def matches(pattern: str, name: str) -> bool:
        return re.fullmatch(sql.pattern_regex(pattern), name) is not None

    assert matches("user.*", "user.created")
    assert not matches("user.*", "user.created.again")
    assert not matches("user.*", "order.x")
    assert matches("user.>", "user.a.b")
    assert not matches("user.>", "user")
    assert matches(">", "anything.at.all")
    assert matches("a-b.c", "a-b.c") and not matches("a-b.c", "a-bxc")


async def stats_become(bus: PostgresBus, lane: Lane, expected: LaneStats) -> None:
    """Acks leave in the background, batched: the lane's stats reach `expected` soon after."""
    deadline = time.monotonic() + 5
    while (found := await bus.stats(lane)) != expected:
        assert time.monotonic() < deadline, f"stats {found}, expected {expected}"
        await asyncio.sleep(0.01)


async def test_publish_then_fetch_gives_attempt_1(bus: PostgresBus, lane: Lane) -> None:
    assert await bus.publish(lane, [message("a"), message("b"), message("c")]) == [True] * 3
    assert await bus.stats(lane) == LaneStats(pending=3, in_flight=0, dlq=0)
    receiver = bus.receiver(lane, consumer="w1")
    deliveries = await receiver.fetch(10)
    assert [(d.id, d.subject, d.body, d.attempt) for d in deliveries] == [
        (name, "demo.email", f'{{"n":"{name}"}}'.encode(), 1) for name in "abc"
    ]
    assert all(d.run_at_ms is not None and d.enqueued_at_ms is not None for d in deliveries)
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=3, dlq=0)
    for delivery in deliveries:
        await receiver.ack(delivery)
    await stats_become(bus, lane, LaneStats(pending=0, in_flight=0, dlq=0))  # acks leave batched
    assert await receiver.fetch(10) == []
    await receiver.close()


async def test_acks_sent_together_remove_every_row(bus: PostgresBus, lane: Lane) -> None:
    await bus.publish(lane, [message(str(n)) for n in range(50)])
    receiver = bus.receiver(lane, consumer="w1")
    deliveries = await fetch_until(receiver, 50)
    await asyncio.gather(*(receiver.ack(d) for d in deliveries))
    await stats_become(bus, lane, LaneStats(pending=0, in_flight=0, dlq=0))


async def test_a_retry_comes_back_when_due_without_a_lease(bus: PostgresBus, lane: Lane) -> None:
    await bus.publish(lane, [message("a")])
    receiver = bus.receiver(lane, consumer="w1")
    [first] = await receiver.fetch(1)
    due = now_ms() + 700
    await receiver.retry(first, due_ms=due, attempts=3)
    # Waiting holds no lease: pending, not in flight.
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
    [again] = await fetch_until(receiver, 1)
    assert now_ms() >= due - 5  # the server's clock is this machine's
    assert (again.id, again.attempt, again.key) == ("a", 4, first.key)
    await receiver.ack(again)
    await receiver.close()


async def test_an_expired_lease_is_claimed_by_another_worker(bus: PostgresBus) -> None:
    lane = job_lane(ack_wait_s=0.5)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a")])
    crashed, alive = bus.receiver(lane, consumer="w1"), bus.receiver(lane, consumer="w2")
    [first] = await crashed.fetch(1)
    assert first.attempt == 1
    # w1 "dies": it never settles nor extends. w2 gets the job once the lease ran out.
    [recovered] = await fetch_until(alive, 1)
    assert (recovered.id, recovered.attempt, recovered.key) == ("a", 2, first.key)
    # The dead worker's late extend cannot take it back from w2.
    await crashed.extend(first)
    await alive.ack(recovered)
    await stats_become(bus, lane, LaneStats(pending=0, in_flight=0, dlq=0))


async def test_extend_keeps_a_running_job_from_being_claimed(bus: PostgresBus) -> None:
    lane = job_lane(ack_wait_s=1.0)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message("a")])
    runner, other = bus.receiver(lane, consumer="w1"), bus.receiver(lane, consumer="w2")
    [running] = await runner.fetch(1)
    until = time.monotonic() + 2.5  # more than twice the ack wait
    while time.monotonic() < until:
        await runner.extend(running)
        assert await other.fetch(1) == []  # each fetch waits at most ~0.5 s
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=1, dlq=0)
    [taken] = await fetch_until(other, 1)  # no more extends: its lease runs out
    assert taken.attempt == 2


async def test_release_hands_it_back_after_the_delay(bus: PostgresBus, lane: Lane) -> None:
    await bus.publish(lane, [message("a")])
    receiver = bus.receiver(lane, consumer="w1")
    [first] = await receiver.fetch(1)
    released_at = time.monotonic()
    await receiver.release(first, delay_s=0.4)
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
    [again] = await fetch_until(receiver, 1)
    assert time.monotonic() - released_at >= 0.35
    assert again.attempt == 2  # a release keeps the deliveries: the next one is the next attempt


async def test_dead_letters_requeue_and_purge(bus: PostgresBus, lane: Lane) -> None:
    await bus.publish(lane, [message("a"), message("b")])
    receiver = bus.receiver(lane, consumer="w1")
    first, second = await fetch_until(receiver, 2)
    await receiver.dead_letter(first, record(first, "one"), terminate=False)
    await receiver.dead_letter(second, record(second, "two"), terminate=True)
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=0, dlq=2)
    assert await bus.count_dead(lane) == 2
    newest, oldest = await bus.dead_letters(lane, limit=10)
    assert (newest["id"], newest["error"]["message"]) == ("b", "two")
    assert (oldest["id"], oldest["payload"]) == ("a", {"n": "a"})
    assert newest["seq"] > oldest["seq"]
    assert [r["id"] for r in await bus.dead_letters(lane, limit=1)] == ["b"]

    await bus.requeue(lane, newest)
    await bus.requeue(lane, newest)  # gone already: not stored twice
    assert await bus.count_dead(lane) == 1
    [back] = await fetch_until(receiver, 1)
    assert (back.id, back.attempt, back.body) == ("b", 1, b'{"n":"b"}')
    assert back.enqueued_at_ms == second.enqueued_at_ms
    await receiver.ack(back)

    assert await bus.purge(lane) == 1
    assert await bus.count_dead(lane) == 0
    # Acks leave in the background (one statement for all waiting): wait for this one's.
    deadline = time.monotonic() + 5
    while (stats := await bus.stats(lane)).in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert stats == LaneStats(pending=0, in_flight=0, dlq=0)


async def test_a_dead_letter_that_was_not_json_is_requeued_as_its_bytes(
    bus: PostgresBus, lane: Lane
) -> None:
    bad = DlqRecord(
        id="x",
        subject="demo.email",
        payload=None,
        error={"type": "T", "message": ""},
        attempts=1,
        first_enqueued_at=None,
        failed_at=now_ms(),
        worker="w",
        raw_b64="bm90IGpzb24=",
    )
    await bus.requeue(lane, bad)  # no seq: stored
    [back] = await fetch_until(bus.receiver(lane, consumer="w1"), 1)
    assert back.body == b"not json"


async def test_dead_letter_raises_when_the_record_is_not_stored(
    bus: PostgresBus, lane: Lane
) -> None:
    await bus.publish(lane, [message("a")])
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await receiver.fetch(1)
    await cut_connections(bus.url)
    with pytest.raises(DriverUnavailable):
        await receiver.dead_letter(delivery, record(delivery), terminate=False)
    with pytest.raises(DriverUnavailable):  # the bus's own connection was cut as well
        await bus.stats(lane)
    # Unsettled, still leased (the bus has reconnected): the loop would release it.
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=1, dlq=0)
    await receiver.release(delivery, delay_s=0)
    [again] = await fetch_until(receiver, 1)
    await receiver.dead_letter(again, record(again), terminate=False)
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=0, dlq=1)


async def cut_connections(url: str) -> None:
    """Terminate the bus's connections on the server (as a restart or a proxy would)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'mega' AND pid <> pg_backend_pid()"
        )


async def test_a_duplicate_id_is_dropped_within_the_window(bus: PostgresBus, lane: Lane) -> None:
    kept = await bus.publish(lane, [message("a", dedup=True), message("a", dedup=True)])
    assert kept == [True, False]
    assert await bus.publish(lane, [message("a", dedup=True)]) == [False]
    assert await bus.publish(lane, [message("a", dedup=False)]) == [True]  # not a caller's id
    other = job_lane("demo.other")
    await bus.ensure(other, apply_limits=False)
    assert await bus.publish(other, [message("a", dedup=True)]) == [True]  # per lane
    assert (await bus.stats(lane)).pending == 2


async def test_a_dedup_key_past_its_window_counts_as_new(bus: PostgresBus, lane: Lane) -> None:
    await bus.publish(lane, [message("a", dedup=True)])
    async with await psycopg.AsyncConnection.connect(bus.url, autocommit=True) as connection:
        await connection.execute(f"UPDATE {schema.DEDUP} SET expires_at = now() - interval '1 s'")
    assert await bus.publish(lane, [message("a", dedup=True)]) == [True]


async def test_a_delayed_message_waits_for_its_time(bus: PostgresBus, lane: Lane) -> None:
    run_at = now_ms() + 800
    await bus.publish(lane, [message("later", run_at_ms=run_at), message("now")])
    receiver = bus.receiver(lane, consumer="w1")
    assert [d.id for d in await receiver.fetch(10)] == ["now"]
    assert await bus.stats(lane) == LaneStats(pending=1, in_flight=1, dlq=0)
    [later] = await fetch_until(receiver, 1)
    assert now_ms() >= run_at - 5
    assert (later.id, later.run_at_ms, later.attempt) == ("later", run_at, 1)


async def test_two_receivers_never_get_the_same_row(bus: PostgresBus, lane: Lane) -> None:
    await bus.publish(lane, [message(str(n)) for n in range(200)])
    seen: list[str] = []

    async def work(receiver: Receiver) -> None:
        while True:
            deliveries = await receiver.fetch(7)
            if not deliveries:
                return
            seen.extend(d.id for d in deliveries)
            for delivery in deliveries:
                await receiver.ack(delivery)

    receivers = [bus.receiver(lane, consumer=f"w{n}") for n in range(2)]
    await asyncio.gather(*(work(r) for r in receivers))
    assert sorted(seen, key=int) == [str(n) for n in range(200)]
    assert await bus.stats(lane) == LaneStats(pending=0, in_flight=0, dlq=0)


async def test_a_notify_wakes_a_waiting_fetch(
    bus: PostgresBus, lane: Lane, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = bus.receiver(lane, consumer="w1")
    assert await receiver.fetch(1) == []  # connected, nothing there
    monkeypatch.setattr(receiver_module, "POLL_S", 60.0)  # only a NOTIFY can end the wait now
    waiting = asyncio.create_task(receiver.fetch(1))
    await asyncio.sleep(0.2)  # let it start waiting
    started = time.monotonic()
    await bus.publish(lane, [message("a")])
    [delivery] = await asyncio.wait_for(waiting, 10)
    assert delivery.id == "a"
    assert time.monotonic() - started < 10


async def test_wake_ends_a_waiting_fetch(
    bus: PostgresBus, lane: Lane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_module, "POLL_S", 60.0)
    receiver = bus.receiver(lane, consumer="w1")
    waiting = asyncio.create_task(receiver.fetch(1))
    await asyncio.sleep(0.2)
    receiver.wake()
    assert await asyncio.wait_for(waiting, 5) == []


async def test_a_lost_connection_is_waited_out(bus: PostgresBus, lane: Lane) -> None:
    receiver = bus.receiver(lane, consumer="w1")
    await receiver.fetch(1)
    await cut_connections(bus.url)
    assert await receiver.fetch(1) == []  # not raised
    with pytest.raises(DriverUnavailable):  # the publishing connection was cut too
        await bus.publish(lane, [message("a")])
    assert await bus.publish(lane, [message("a")]) == [True]  # reconnected
    [delivery] = await fetch_until(receiver, 1)
    assert delivery.id == "a"
    await bus.ping()


async def test_announced_commits_wake_the_watchers(bus: PostgresBus, postgres_url: str) -> None:
    other = await PostgresBus.connect("jobs", BusSpec(driver="postgres", url=postgres_url))
    woken = asyncio.Event()
    stop = await bus.watch_commits(woken.set)
    try:
        other.announce_commit()  # another process's relay
        await asyncio.wait_for(woken.wait(), 10)
    finally:
        await stop()
        await other.close()


# -- events -------------------------------------------------------------------------------------


async def drain(receiver: Receiver, quiet_fetches: int = 2) -> list[Delivery]:
    """Everything the receiver gets, acked, until `quiet_fetches` fetches in a row bring none."""
    found: list[Delivery] = []
    quiet = 0
    while quiet < quiet_fetches:
        deliveries = await receiver.fetch(50)
        quiet = 0 if deliveries else quiet + 1
        for delivery in deliveries:
            await receiver.ack(delivery)
        found += deliveries
    return found


async def test_each_group_gets_each_matching_event_once(bus: PostgresBus) -> None:
    await bus.ensure_events(max_age_s=3600)
    users, everything = group_lane("users", "user.*"), group_lane("audit", ">")
    for lane in (users, everything):
        await bus.ensure(lane, apply_limits=False)
    events = [
        message("e1", subject="user.created"),
        message("e2", subject="order.x"),
        message("e3", subject="user.deleted"),
    ]
    assert await bus.emit(events, max_age_s=3600) == [True, True, True]
    assert await bus.emit([message("e1", subject="user.created")], max_age_s=3600) == [False]
    assert await bus.stats(users) == LaneStats(pending=2, in_flight=0, dlq=0)

    got_users = await drain(bus.receiver(users, consumer="w1"))
    got_all = await drain(bus.receiver(everything, consumer="w1"))
    assert [(d.id, d.subject, d.attempt) for d in got_users] == [
        ("e1", "user.created", 1),
        ("e3", "user.deleted", 1),
    ]
    assert [d.id for d in got_all] == ["e1", "e2", "e3"]
    assert got_all[0].enqueued_at_ms == events[0].enqueued_at_ms
    assert await bus.stats(users) == LaneStats(pending=0, in_flight=0, dlq=0)


async def test_a_group_made_later_replays_the_kept_events(bus: PostgresBus) -> None:
    await bus.ensure_events(max_age_s=3600)
    await bus.emit([message(f"e{n}", subject="user.x") for n in range(3)], max_age_s=3600)
    late = group_lane("late", "user.>")
    await bus.ensure(late, apply_limits=False)
    await bus.ensure(late, apply_limits=False)  # idempotent: the cursor stays
    assert [d.id for d in await drain(bus.receiver(late, consumer="w1"))] == ["e0", "e1", "e2"]


async def test_receivers_of_one_group_split_its_events(bus: PostgresBus) -> None:
    await bus.ensure_events(max_age_s=3600)
    lane = group_lane("split", "user.*")
    await bus.ensure(lane, apply_limits=False)
    receivers = [bus.receiver(lane, consumer=f"w{n}") for n in range(2)]
    emitted = [f"e{n}" for n in range(120)]
    emit = bus.emit([message(e, subject="user.x") for e in emitted], max_age_s=3600)
    first, second, _ = await asyncio.gather(drain(receivers[0], 3), drain(receivers[1], 3), emit)
    ids = [d.id for d in first + second]
    assert sorted(ids) == sorted(emitted)  # every event once, none twice


async def test_a_group_retry_and_dead_letter_stay_in_the_group(bus: PostgresBus) -> None:
    await bus.ensure_events(max_age_s=3600)
    one, two = group_lane("one", "user.*"), group_lane("two", "user.*")
    for lane in (one, two):
        await bus.ensure(lane, apply_limits=False)
    await bus.emit([message("e1", subject="user.x")], max_age_s=3600)
    receiver = bus.receiver(one, consumer="w1")
    [delivery] = await fetch_until(receiver, 1)
    await receiver.retry(delivery, due_ms=now_ms(), attempts=1)
    [again] = await fetch_until(receiver, 1)
    assert again.attempt == 2
    await receiver.dead_letter(again, record(again), terminate=False)
    assert await bus.stats(one) == LaneStats(pending=0, in_flight=0, dlq=1)
    [dead] = await bus.dead_letters(one, limit=5)
    await bus.requeue(one, dead)
    [requeued] = await fetch_until(receiver, 1)
    assert (requeued.id, requeued.subject, requeued.attempt) == ("e1", "user.x", 1)
    # The other group was never touched by any of it.
    assert [d.id for d in await drain(bus.receiver(two, consumer="w1"))] == ["e1"]
    assert await bus.count_dead(two) == 0


async def test_pruning_deletes_old_events_and_dead_letters(bus: PostgresBus) -> None:
    await bus.ensure_events(max_age_s=0.3)
    lane = Lane(
        kind="group", name="g", subject=">", concurrency=1, ack_wait_s=30, dlq_max_age_s=0.3
    )
    await bus.ensure(lane, apply_limits=False)
    await bus.emit([message("old", subject="a.b")], max_age_s=0.3)
    receiver = bus.receiver(lane, consumer="w1")
    [delivery] = await fetch_until(receiver, 1)
    await receiver.dead_letter(delivery, record(delivery), terminate=False)
    assert await bus.count_dead(lane) == 1
    # A new receiver prunes at its first fetch what is past its age on the server's clock:
    # both, 0.3 s after they were written.
    deadline = time.monotonic() + 10
    for n in itertools.count(2):
        await bus.receiver(lane, consumer=f"w{n}").fetch(1)
        async with await psycopg.AsyncConnection.connect(bus.url, autocommit=True) as connection:
            cursor = await connection.execute(f"SELECT count(*) FROM {schema.EVENTS}")
            events = await cursor.fetchone()
        if (await bus.count_dead(lane), events) == (0, (0,)):
            break
        assert time.monotonic() < deadline, "never pruned"
        await asyncio.sleep(0.05)


# -- transactional enqueue, connect, migrations ---------------------------------------------------


async def test_publish_in_follows_the_callers_transaction(bus: PostgresBus, lane: Lane) -> None:
    engine = create_engine(bus.url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session:
            assert bus.publish_in(session, lane, [message("rolled-back")]) == [True]
            session.rollback()
        assert await bus.stats(lane) == LaneStats(pending=0, in_flight=0, dlq=0)
        receiver = bus.receiver(lane, consumer="w1")
        assert await receiver.fetch(1) == []
        with Session(engine) as session:
            kept = bus.publish_in(
                session, lane, [message("kept", dedup=True), message("kept", dedup=True)]
            )
            session.commit()
        assert kept == [True, False]
        assert await bus.stats(lane) == LaneStats(pending=1, in_flight=0, dlq=0)
        [delivery] = await fetch_until(receiver, 1)
        assert (delivery.id, delivery.attempt) == ("kept", 1)
    finally:
        engine.dispose()


async def test_connect_to_a_closed_port_says_so_in_one_line() -> None:
    url = f"postgresql://mega:secret@127.0.0.1:{free_port()}/mega"
    with pytest.raises(DependencyUnavailable) as caught:
        await PostgresBus.connect("jobs", BusSpec(driver="postgres", url=url))
    assert caught.value.dependency == "postgres"
    message = str(caught.value)
    assert message.startswith("cannot reach PostgreSQL 'jobs' at postgresql://mega:***@127.0.0.1:")
    assert "\n" not in message and "secret" not in message


async def test_migrations_make_the_tables_the_bus_uses(postgres_url: str) -> None:
    database = Database(postgres_url)
    try:
        await asyncio.to_thread(upgrade, database)
    finally:
        database.dispose()
    async with await psycopg.AsyncConnection.connect(postgres_url) as connection:
        tables = [*schema.TABLES, schema.RECORDS]
        cursor = await connection.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename = ANY(%s)", [tables]
        )
        assert await cursor.fetchone() == (len(tables),)
    bus = await PostgresBus.connect("jobs", BusSpec(driver="postgres", url=postgres_url))
    try:
        lane = job_lane(keep_status_s=60)
        assert await bus.publish(lane, [message("a")]) == [True]  # no ensure: migrated
        [delivery] = await fetch_until(bus.receiver(lane, consumer="w1"), 1)
        assert delivery.id == "a"
        assert await bus.put_records(lane, "status", [("a", b"done")], create=True) == [True]
        assert (await bus.get_records(lane, "status", ["a"]))[0] == b"done"
    finally:
        await bus.close()


async def test_a_fair_claim_deals_the_keys_in_turns_round_from_the_last(bus: PostgresBus) -> None:
    """Five keys with three jobs each, claims of two: each claim goes on from the key after the
    last one served, round the keys, then the second jobs of each; a job without a key takes
    its turns like a key and comes back with none."""
    lane = job_lane("fair.turns", fair=True)
    await bus.ensure(lane, apply_limits=False)
    keys = ["a", "b", "c", "d", None]
    await bus.publish(
        lane,
        [
            message(f"{key}{n}", subject=lane.subject, flow_key=key)
            for n in range(3)
            for key in keys
        ],
    )
    receiver = bus.receiver(lane, consumer="test")
    served: list[str | None] = []
    while len(served) < 15:
        claimed = await fetch_until(receiver, min(2, 15 - len(served)))
        assert claimed
        served += [delivery.flow_key for delivery in claimed]
        for delivery in claimed:
            await receiver.ack(delivery)
    # The first claim starts at the least key after no key (stored as FAIR_NO_KEY, the least).
    assert served == ["a", "b", "c", "d", None] * 3
    await receiver.close()


async def test_a_fair_claim_reads_the_heads_of_the_keys_not_every_row(
    bus: PostgresBus, postgres_url: str
) -> None:
    """20,000 jobs of one key and one of another: the claim's plan reads a few rows per key
    (its key walk and each key's head), not the 20,001 waiting."""
    lane = job_lane("fair.heads", fair=True)
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(
        lane, [message(f"big{n}", subject=lane.subject, flow_key="big") for n in range(20_000)]
    )
    await bus.publish(lane, [message("small", subject=lane.subject, flow_key="small")])
    params = {
        "lane": lane_key(lane),
        "limit": 10,
        "ack_wait_s": 30.0,
        "consumer": "plan",
        "after": schema.FAIR_NO_KEY,
    }
    async with await psycopg.AsyncConnection.connect(postgres_url) as connection:
        await connection.execute(f"ANALYZE {schema.JOBS}")
        cursor = await connection.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.CLAIM_FAIR, params
        )
        plan = (await cursor.fetchone())[0][0]["Plan"]  # type: ignore[index]
        await connection.rollback()  # the claim's lease is not kept

    def rows_read(node: dict[str, Any]) -> int:
        own = node["Actual Rows"] * node["Actual Loops"] if "Scan" in node["Node Type"] else 0
        return own + sum(rows_read(child) for child in node.get("Plans", []))

    assert rows_read(plan) < 200


async def test_a_deep_lane_is_counted_by_estimate_and_a_shallow_one_exactly(
    bus: PostgresBus, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past STATS_EXACT_ROWS rows a lane's stats are an estimate that reads only the claim
    index's head (its leased rows counted there) and the planner's statistics; at or below it,
    every row is counted."""
    monkeypatch.setattr(sql, "STATS_EXACT_ROWS", 50)
    lane = job_lane("deep.lane")
    await bus.ensure(lane, apply_limits=False)
    await bus.publish(lane, [message(f"j{n}", subject=lane.subject) for n in range(50)])
    assert await bus.stats(lane) == LaneStats(pending=50, in_flight=0, dlq=0)
    assert not (await bus.stats(lane)).approximate
    await bus.publish(lane, [message(f"k{n}", subject=lane.subject) for n in range(150)])
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as connection:
        await connection.execute(f"ANALYZE {schema.JOBS}")  # what autovacuum does as rows come
    receiver = bus.receiver(lane, consumer="test")
    assert len(await fetch_until(receiver, 7)) == 7
    stats = await bus.stats(lane)
    assert stats.approximate and (stats.in_flight, stats.dlq) == (7, 0)
    # The planner's estimate: exact here where ANALYZE read every row of the table, within a
    # sample's error where the session's other tests left more rows than it samples.
    assert 100 <= stats.pending <= 300, stats
    assert stats.oldest_ms is not None and stats.stored == 200
    await receiver.close()
