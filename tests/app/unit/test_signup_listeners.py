"""The four listener groups of UserSignedUp, each with the memory bus, Redis in memory and a
SQLite database of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from app.events.listeners import (
    LISTENERS,
    STATS_KEY,
    CrmSyncListener,
    SignupStatsListener,
    WelcomeCreditListener,
    WelcomeEmailListener,
)
from app.events.signups import UserSignedUp
from app.jobs.email import EmailJob
from app.services.signups import Credit, create_tables
from mega import Context, Database, EventBus, JobQueue, ReceivedEvent
from mega.drivers.memory import MemoryBus
from mega.runtime.migrate import upgrade
from mega.testing import drain, memory_context


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[Context]:
    context = memory_context("jobs", caches=["main"])
    context.database = db = Database(f"sqlite:///{tmp_path / 'sample.db'}")
    upgrade(db)  # the framework's tables: the inbox of WelcomeCreditListener
    create_tables(db)  # the sample's: demo_credits
    yield context
    db.dispose()


async def sign_up(ctx: Context, *emails: str) -> list[str]:
    """Emit one UserSignedUp per address (the outbox's relay does it in the app); their ids."""
    bus = EventBus(ctx, "jobs")
    return [
        await bus.emit(UserSignedUp, {"signup_id": number, "email": email})
        for number, email in enumerate(emails, 1)
    ]


async def redeliver(ctx: Context, event_id: str, email: str) -> None:
    """The same event again, once the bus forgot its id (as after the dedup window)."""
    ctx.bus("jobs", MemoryBus).native.dedup.clear()
    payload = {"signup_id": 1, "email": email}
    assert await EventBus(ctx, "jobs").emit(UserSignedUp, payload, id=event_id) == event_id


async def test_a_signup_runs_every_group_and_the_welcome_email_it_enqueues(ctx: Context) -> None:
    [event_id] = await sign_up(ctx, "ada@example.com")
    report = await drain(ctx, jobs=[EmailJob], listeners=LISTENERS)
    for group in [*(listener.group for listener in LISTENERS), "EmailJob"]:
        assert report.count(group, "done") == 1, group
    [welcome] = [s for s in report.signals if s.get("job") == "EmailJob" and s["signal"] == "done"]
    assert welcome["id"] == "w" + event_id[:11]  # derived from the event: a redelivery dedups


async def test_a_redelivered_signup_enqueues_its_welcome_email_once(ctx: Context) -> None:
    event = ReceivedEvent("e1", UserSignedUp.name, {"email": "ada@example.com"}, None, attempt=1)
    await WelcomeEmailListener().run(event, ctx)
    await WelcomeEmailListener().run(event, ctx)  # at-least-once: the same event, again
    assert (await JobQueue(ctx, "jobs").stats(EmailJob)).pending == 1  # the job id is "we1"


async def test_the_stats_count_each_domain_once_per_event_id(ctx: Context) -> None:
    [first, *_] = await sign_up(ctx, "ada@example.com", "bob@Example.com", "cy@test.org")
    await drain(ctx, listeners=[SignupStatsListener])
    redis = ctx.cache("main").native
    assert await redis.hgetall(STATS_KEY) == {"example.com": "2", "test.org": "1"}
    await redeliver(ctx, first, "ada@example.com")
    report = await drain(ctx, listeners=[SignupStatsListener])
    assert report.count("SignupStatsListener", "skip") == 1  # the same id counts nothing more
    assert await redis.hgetall(STATS_KEY) == {"example.com": "2", "test.org": "1"}


async def test_welcome_credits_are_granted_once_per_signup_event(ctx: Context) -> None:
    [first, second] = await sign_up(ctx, "ada@example.com", "bob@example.com")
    await drain(ctx, listeners=[WelcomeCreditListener])
    await redeliver(ctx, first, "ada@example.com")
    report = await drain(ctx, listeners=[WelcomeCreditListener])
    assert report.count("WelcomeCreditListener", "skip") == 1  # its id was committed: no row
    query = select(Credit.event_id, Credit.amount)
    credits = await ctx.db.run(lambda session: [tuple(row) for row in session.execute(query)])
    assert sorted(credits) == sorted([(first, 10), (second, 10)])


async def test_the_crm_rejects_fail_addresses_into_its_own_dlq(ctx: Context) -> None:
    [rejected, _] = await sign_up(ctx, "fail.ada@example.com", "bob@example.com")
    report = await drain(ctx, listeners=[CrmSyncListener, WelcomeEmailListener])
    assert report.count("CrmSyncListener", "retry") == 2
    assert report.count("CrmSyncListener", "done") == 1  # bob
    assert report.count("WelcomeEmailListener", "done") == 2  # the other groups are unaffected
    [record] = await EventBus(ctx, "jobs").dlq.list(CrmSyncListener)
    assert (record["id"], record["attempts"]) == (rejected, 3)
    assert record["error"]["message"] == "the CRM rejected fail.ada@example.com"
    assert (await JobQueue(ctx, "jobs").stats(EmailJob)).pending == 2  # not drained: queued
