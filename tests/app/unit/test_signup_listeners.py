"""The three listener groups of UserSignedUp, each with the memory bus and Redis in memory."""

from __future__ import annotations

from app.events.listeners import (
    LISTENERS,
    STATS_KEY,
    CrmSyncListener,
    SignupStatsListener,
    WelcomeEmailListener,
)
from app.events.signups import UserSignedUp
from app.jobs.email import EmailJob
from mega import Context, EventBus, JobQueue, ReceivedEvent
from mega.testing import drain, memory_context


def new_context() -> Context:
    return memory_context("jobs", caches=["main"])


async def sign_up(ctx: Context, *emails: str) -> list[str]:
    """Emit one UserSignedUp per address (the outbox's relay does it in the app); their ids."""
    bus = EventBus(ctx, "jobs")
    return [
        await bus.emit(UserSignedUp, {"signup_id": number, "email": email})
        for number, email in enumerate(emails, 1)
    ]


async def test_a_signup_runs_every_group_and_the_welcome_email_it_enqueues() -> None:
    ctx = new_context()
    [event_id] = await sign_up(ctx, "ada@example.com")
    report = await drain(ctx, jobs=[EmailJob], listeners=LISTENERS)
    for group in ("WelcomeEmailListener", "SignupStatsListener", "CrmSyncListener", "EmailJob"):
        assert report.count(group, "done") == 1, group
    [welcome] = [s for s in report.signals if s.get("job") == "EmailJob" and s["signal"] == "done"]
    assert welcome["id"] == "w" + event_id[:11]  # derived from the event: a redelivery dedups


async def test_a_redelivered_signup_enqueues_its_welcome_email_once() -> None:
    ctx = new_context()
    event = ReceivedEvent("e1", UserSignedUp.name, {"email": "ada@example.com"}, None, attempt=1)
    await WelcomeEmailListener().run(event, ctx)
    await WelcomeEmailListener().run(event, ctx)  # at-least-once: the same event, again
    assert (await JobQueue(ctx, "jobs").stats(EmailJob)).pending == 1  # the job id is "we1"


async def test_the_stats_count_each_domain_once_per_event_id() -> None:
    ctx = new_context()
    await sign_up(ctx, "ada@example.com", "bob@Example.com", "cy@test.org")
    await drain(ctx, listeners=[SignupStatsListener])
    redis = ctx.cache("main").native
    assert await redis.hgetall(STATS_KEY) == {"example.com": "2", "test.org": "1"}
    again = ReceivedEvent("e1", UserSignedUp.name, {"email": "dee@test.org"}, None, attempt=1)
    await SignupStatsListener().run(again, ctx)
    await SignupStatsListener().run(again, ctx)  # redelivered: the same id counts nothing more
    assert await redis.hget(STATS_KEY, "test.org") == "2"


async def test_the_crm_rejects_fail_addresses_into_its_own_dlq() -> None:
    ctx = new_context()
    [rejected, _] = await sign_up(ctx, "fail.ada@example.com", "bob@example.com")
    report = await drain(ctx, listeners=[CrmSyncListener, WelcomeEmailListener])
    assert report.count("CrmSyncListener", "retry") == 2
    assert report.count("CrmSyncListener", "done") == 1  # bob
    assert report.count("WelcomeEmailListener", "done") == 2  # the other groups are unaffected
    [record] = await EventBus(ctx, "jobs").dlq.list(CrmSyncListener)
    assert (record["id"], record["attempts"]) == (rejected, 3)
    assert record["error"]["message"] == "the CRM rejected fail.ada@example.com"
    assert (await JobQueue(ctx, "jobs").stats(EmailJob)).pending == 2  # not drained: queued
