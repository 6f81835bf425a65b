"""EmailJob's modes on the memory bus: attempts, the dead-letter queue and the page's timeline."""

from __future__ import annotations

from typing import Any

from app.jobs.email import EmailJob
from app.jobs.timeline import attach_timeline
from app.services import job_timeline
from mega import Context, JobQueue
from mega.testing import drain, memory_context


async def send(ctx: Context, mode: str) -> dict[str, Any]:
    """Enqueue one EmailJob as the page does, drain, and return its record with its timeline."""
    redis = ctx.cache("main").native
    await job_timeline.record_enqueued(redis, "j1", "ada@example.com", mode)
    payload = {"id": "j1", "to": "ada@example.com", "mode": mode}
    await JobQueue(ctx, "jobs").enqueue(EmailJob, payload, id="j1")
    await drain(ctx, jobs=[EmailJob], hooks={"worker": [attach_timeline]})
    [job] = (await job_timeline.list_jobs(redis)).jobs
    return job


def kinds(job: dict[str, Any]) -> list[str]:
    return [event["kind"] for event in job["events"]]


async def test_ok_succeeds_on_the_first_attempt() -> None:
    job = await send(memory_context("jobs", caches=["main"]), "ok")
    assert (job["status"], job["attempts"]) == ("done", 1)
    assert kinds(job) == ["enqueued", "start", "done"]


async def test_flaky_fails_once_then_succeeds() -> None:
    job = await send(memory_context("jobs", caches=["main"]), "flaky")
    assert (job["status"], job["attempts"]) == ("done", 2)
    assert kinds(job) == ["enqueued", "start", "retry", "start", "done"]
    assert "SMTP server timed out" in job["events"][2]["detail"]


async def test_fail_uses_its_three_attempts_then_lands_in_the_dlq() -> None:
    ctx = memory_context("jobs", caches=["main"])
    job = await send(ctx, "fail")
    assert (job["status"], job["attempts"]) == ("dlq", 3)
    assert kinds(job) == ["enqueued"] + ["start", "retry"] * 2 + ["start", "fail", "dlq"]
    [record] = await JobQueue(ctx, "jobs").dlq.list(EmailJob)
    assert (record["id"], record["attempts"]) == ("j1", 3)
    assert record["error"] == {
        "type": "SimulatedSendError",
        "message": "mailbox ada@example.com rejected the message",
    }


async def test_permanent_skips_the_retries_and_lands_in_the_dlq_after_one_attempt() -> None:
    ctx = memory_context("jobs", caches=["main"])
    job = await send(ctx, "permanent")
    assert (job["status"], job["attempts"]) == ("dlq", 1)
    assert kinds(job) == ["enqueued", "start", "fail", "dlq"]
    [record] = await JobQueue(ctx, "jobs").dlq.list(EmailJob)
    assert (record["id"], record["attempts"]) == ("j1", 1)
    assert record["error"] == {
        "type": "Permanent",
        "message": "no mailbox ada@example.com: the domain says it does not exist",
    }
    status = await JobQueue(ctx, "jobs").status(EmailJob, "j1")
    assert status is not None and (status.state, status.attempts) == ("dlq", 1)
