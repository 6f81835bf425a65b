"""EmailJob's modes on the memory bus: attempts, the dead-letter queue, and the page's card read
off each job's status record."""

from __future__ import annotations

from app.jobs.email import EmailJob
from app.jobs.observers import attach_job_observers
from app.services import recent_jobs
from app.services.job_card import Line, card_lines
from mega import Context, JobQueue, JobStatus
from mega.testing import drain, memory_context


async def send(ctx: Context, mode: str) -> JobStatus:
    """Enqueue one EmailJob as the page does, drain, and return its status record."""
    await recent_jobs.remember(ctx.cache("main").native, "j1", "ada@example.com", mode)
    payload = {"id": "j1", "to": "ada@example.com", "mode": mode}
    await JobQueue(ctx, "jobs").enqueue(EmailJob, payload, id="j1")
    await drain(ctx, jobs=[EmailJob], hooks={"worker": [attach_job_observers]})
    status = await JobQueue(ctx, "jobs").status(EmailJob, "j1")
    assert status is not None
    return status


def kinds(lines: list[Line]) -> list[str]:
    return [line.kind for line in lines]


async def test_ok_succeeds_on_the_first_attempt_and_keeps_its_result() -> None:
    ctx = memory_context("jobs", caches=["main"])
    status = await send(ctx, "ok")
    assert (status.state, status.attempts, status.history) == ("done", 1, ())
    assert kinds(card_lines(status)) == ["enqueued", "done"]
    result = await JobQueue(ctx, "jobs").result(EmailJob, "j1")
    assert result == {"sent_to": "ada@example.com", "attempt": 1}


async def test_flaky_fails_once_then_succeeds() -> None:
    status = await send(memory_context("jobs", caches=["main"]), "flaky")
    assert (status.state, status.attempts) == ("done", 2)
    [first] = status.history
    assert (first.attempt, first.state) == (1, "retrying")
    assert first.error is not None and "SMTP server timed out" in first.error.message
    assert kinds(card_lines(status)) == ["enqueued", "retry", "done"]


async def test_fail_uses_its_three_attempts_then_lands_in_the_dlq() -> None:
    ctx = memory_context("jobs", caches=["main"])
    status = await send(ctx, "fail")
    assert (status.state, status.attempts) == ("dlq", 3)
    assert [(a.attempt, a.state) for a in status.history] == [(1, "retrying"), (2, "retrying")]
    assert kinds(card_lines(status)) == ["enqueued", "retry", "retry", "fail", "dlq"]
    [record] = await JobQueue(ctx, "jobs").dlq.list(EmailJob)
    assert (record["id"], record["attempts"]) == ("j1", 3)
    assert record["error"] == {
        "type": "SimulatedSendError",
        "message": "mailbox ada@example.com rejected the message",
    }


async def test_permanent_skips_the_retries_and_lands_in_the_dlq_after_one_attempt() -> None:
    ctx = memory_context("jobs", caches=["main"])
    status = await send(ctx, "permanent")
    assert (status.state, status.attempts, status.history) == ("dlq", 1, ())
    assert kinds(card_lines(status)) == ["enqueued", "fail", "dlq"]
    [record] = await JobQueue(ctx, "jobs").dlq.list(EmailJob)
    assert (record["id"], record["attempts"]) == ("j1", 1)
    assert record["error"] == {
        "type": "Permanent",
        "message": "no mailbox ada@example.com: the domain says it does not exist",
    }
