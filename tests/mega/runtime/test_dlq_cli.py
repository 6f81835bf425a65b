"""`mega dlq` as a user runs it, on a real NATS: a requeue names what it replays (one `--id`,
or `--all`) and is refused with neither, replaying nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mega import Job
from mega.config import Config, load_config
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import stream_name
from mega.jobs.queue import JobQueue
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import job_worker, write_config
from tests.mega.runtime.test_cli import run_mega

# A job that always fails and is not retried: each enqueue is one dead letter at once.
FAILING_JOB = """
from mega import Job

class MailJob(Job):
    subject = {subject!r}
    bus = "jobs"
    retries = 0

    async def run(self, payload, ctx):
        raise RuntimeError("mailbox full")

jobs = [MailJob]
"""
IDS = ("id-a", "id-b", "id-c")


@pytest.fixture
def config(tmp_path: Path, nats_url: str, redis_url: str) -> Config:
    subject = f"dlqcli.{uuid.uuid4().hex[:8]}.mail"
    body = FAILING_JOB.format(subject=subject)
    return load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))


@pytest.fixture
async def queue(config: Config) -> AsyncIterator[JobQueue]:
    """The config's queue, its MailJob DLQ holding one record per id of IDS (a, b, c), and no
    worker left: what a requeue puts back stays on the work stream to be counted."""
    ctx = await boot(config, role="test", database=False)
    queue = JobQueue(ctx, "jobs")
    (job,) = config.jobs
    async with job_worker(config):
        for job_id in IDS:
            await queue.enqueue(job, {"to": job_id}, id=job_id)
        deadline = asyncio.get_running_loop().time() + 15
        while await queue.dlq.count(job) < len(IDS):
            assert asyncio.get_running_loop().time() < deadline, "the DLQ never filled"
            await asyncio.sleep(0.05)
    try:
        yield queue
    finally:
        await shutdown(ctx)


async def mega_dlq(config: Config, *args: str) -> tuple[int, str, str]:
    done = await asyncio.to_thread(run_mega, "dlq", *args, "--config", str(config.path))
    return done.returncode, done.stdout, done.stderr


async def state(queue: JobQueue, config: Config) -> tuple[list[str], int]:
    """The ids left in the DLQ (newest first) and the messages waiting on the work stream."""
    assert isinstance(queue.bus, NatsBus)
    (job,) = config.jobs
    assert issubclass(job, Job)
    waiting = (await queue.bus.js.stream_info(stream_name(job.subject))).state.messages
    return [r["id"] for r in await queue.dlq.list(job)], int(waiting)


async def test_requeue_without_id_or_all_is_refused_and_says_what_it_would_replay(
    config: Config, queue: JobQueue
) -> None:
    code, out, err = await mega_dlq(config, "requeue", "--job", "MailJob")
    assert code == 2, err
    assert err.splitlines() == [
        "mega dlq: error: requeue needs --id or --all: 3 dead letters of MailJob would be "
        "replayed; pass --id ID for one (`mega dlq list --job MailJob` shows the ids) or --all "
        "to replay them all"
    ]
    assert out == ""
    code, _, err = await mega_dlq(config, "requeue")  # every job of the config: the same rule
    assert code == 2 and "3 dead letters of MailJob would be replayed" in err
    code, _, err = await mega_dlq(config, "requeue", "--job", "MailJob", "--id", "id-a", "--all")
    assert code == 2 and "not both" in err
    code, _, err = await mega_dlq(config, "list", "--all")
    assert code == 2 and "--all goes with requeue only" in err
    assert await state(queue, config) == (["id-c", "id-b", "id-a"], 0)  # nothing replayed


async def test_requeue_id_replays_that_record_and_all_replays_the_rest(
    config: Config, queue: JobQueue
) -> None:
    code, out, err = await mega_dlq(config, "list", "--job", "MailJob", "--limit", "1", "--json")
    assert code == 0, err
    (line,) = out.splitlines()
    newest = json.loads(line)
    assert (newest["job"], newest["id"], newest["attempts"]) == ("MailJob", "id-c", 1)
    assert newest["error"] == {"type": "RuntimeError", "message": "mailbox full"}
    code, out, _ = await mega_dlq(config, "list", "--job", "MailJob", "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["id-c", "id-b", "id-a"]

    code, out, err = await mega_dlq(config, "requeue", "--job", "MailJob", "--id", newest["id"])
    assert (code, out) == (0, "MailJob: requeued 1 job(s)\n"), err
    assert await state(queue, config) == (["id-b", "id-a"], 1)
    code, out, err = await mega_dlq(config, "requeue", "--job", "MailJob", "--all")
    assert (code, out) == (0, "MailJob: requeued 2 job(s)\n"), err
    assert await state(queue, config) == ([], 3)
