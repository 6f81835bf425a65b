"""The transactional inbox (`inbox = "db"`) on SQLite and PostgreSQL: a redelivered event id runs
its database effect once, a failed run rolls back its effect and its mark, two attempts at once
commit one effect, and old marks are pruned. The bus is the memory driver: what is proven here
is the database's part (tests/mega/events/test_inbox_faults.py adds real workers and SIGKILL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy.orm import Session

from mega import Context, Event, EventBus, Listener, ListenerRunner, ReceivedEvent
from mega.database import Database
from mega.drivers.memory import MemoryBus
from mega.events.db_inbox import DbInbox, InboxRow, InboxTransaction
from mega.runtime.migrate import upgrade
from mega.testing import memory_context
from tests.mega.jobs.test_contract import until

EFFECTS = Table(
    "test_effects",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(255)),
    Column("attempt", Integer),
)


class Paid(Event):
    name = "payments.paid"
    bus = "jobs"


class Ledger(Listener):
    """Writes one effect row per run; fails attempts up to `fail_attempts` after the write."""

    event = Paid
    inbox = "db"
    retries = 1
    backoff = {"type": "exponential", "initial": 10, "max": 10}

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        await event.db.run(lambda session: write_effect(session, event))
        if event.attempt <= event.data.get("fail_attempts", 0):
            raise RuntimeError(f"attempt {event.attempt} fails after its write")


def write_effect(session: Session, event: ReceivedEvent) -> None:
    session.execute(insert(EFFECTS).values(event_id=event.id, attempt=event.attempt))


class Setup:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.bus = EventBus(ctx, "jobs")
        self.seen: list[dict[str, Any]] = []
        self.worker = ListenerRunner(ctx)
        self.worker.register(Ledger)
        for name in ("done", "skip", "retry", "dlq"):
            self.worker.on(name, self.seen.append)

    def count(self, signal: str, event_id: str) -> int:
        return sum(1 for s in self.seen if s["signal"] == signal and s["id"] == event_id)

    async def effects(self, event_id: str) -> list[int]:
        """The attempts whose effect row committed for this event id."""
        query = select(EFFECTS.c.attempt).where(EFFECTS.c.event_id == event_id)
        return await self.ctx.db.run(lambda session: list(session.scalars(query)))

    async def marks(self, event_id: str) -> int:
        query = select(func.count()).where(InboxRow.event_id == event_id)
        return await self.ctx.db.run(lambda session: int(session.scalar(query) or 0))

    async def redeliver(self, event_id: str, payload: Any) -> None:
        """Publish the event again under the same id once the bus forgot it (as after a relay
        that came back past the two-minute dedup window)."""
        self.ctx.bus("jobs", MemoryBus).native.dedup.clear()
        assert await self.bus.emit(Paid, payload, id=event_id) == event_id


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return f"sqlite:///{tmp_path / 'inbox.db'}"


@pytest.fixture
async def setup(database_url: str) -> AsyncIterator[Setup]:
    ctx = memory_context("jobs")
    ctx.database = db = Database(database_url)
    upgrade(db)
    EFFECTS.metadata.create_all(db.engine)
    found = Setup(ctx)
    await found.worker.start()
    yield found
    await found.worker.stop(5)
    db.dispose()


async def test_a_redelivered_event_runs_its_effect_once(setup: Setup) -> None:
    event_id = await setup.bus.emit(Paid, {})
    await until(lambda: setup.count("done", event_id) == 1, "the first delivery")
    assert await setup.effects(event_id) == [1]
    assert await setup.marks(event_id) == 1

    await setup.redeliver(event_id, {})
    await until(lambda: setup.count("skip", event_id) == 1, "the skip")
    assert await setup.effects(event_id) == [1]  # the effect did not run again
    assert await setup.marks(event_id) == 1


async def test_a_failed_run_rolls_back_its_effect_and_the_mark(setup: Setup) -> None:
    retried = await setup.bus.emit(Paid, {"fail_attempts": 1})
    doomed = await setup.bus.emit(Paid, {"fail_attempts": 2})
    await until(lambda: setup.count("done", retried) == 1, "the retry")
    await until(lambda: setup.count("dlq", doomed) == 1, "the dead letter")
    assert await setup.effects(retried) == [2]  # attempt 1 wrote, failed and was rolled back
    assert await setup.marks(retried) == 1
    assert await setup.effects(doomed) == []  # both attempts rolled back
    assert await setup.marks(doomed) == 0


async def test_two_attempts_at_once_commit_one_effect(setup: Setup) -> None:
    """Both pass the first check; the primary key lets one commit and rolls the other back."""
    inbox = DbInbox(setup.ctx.db, "racers", ttl_s=3600)
    both_checked = asyncio.Barrier(2)
    event = ReceivedEvent("race-1", Paid.name, {}, None, attempt=1)

    async def attempt(transaction: InboxTransaction) -> None:
        await both_checked.wait()  # neither writes before both have found no mark
        await transaction.run(lambda session: write_effect(session, event))

    outcomes = await asyncio.gather(*(inbox.deliver("race-1", attempt) for _ in range(2)))
    assert sorted(outcomes) == [False, True]
    assert await setup.effects("race-1") == [1]
    assert await setup.marks("race-1") == 1


async def test_marks_older_than_the_ttl_are_pruned(setup: Setup) -> None:
    inbox = DbInbox(setup.ctx.db, "pruned", ttl_s=3600)
    now = datetime.now(UTC)

    def rows(session: Session) -> None:
        for n, age in enumerate([timedelta(hours=2), timedelta(hours=2), timedelta(minutes=5)]):
            session.add(InboxRow(group_name="pruned", event_id=f"e{n}", done_at=now - age))
        session.add(InboxRow(group_name="other", event_id="e0", done_at=now - timedelta(days=9)))

    await setup.ctx.db.run(rows)
    assert await inbox.prune() == 2
    left = await setup.ctx.db.run(
        lambda session: sorted(session.execute(select(InboxRow.group_name, InboxRow.event_id)))
    )
    assert [tuple(row) for row in left] == [("other", "e0"), ("pruned", "e2")]  # its own only
