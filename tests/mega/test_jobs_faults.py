"""Process-level faults of a job worker: SIGKILL mid-job, a job that kills its process, SIGTERM.

Each worker is a real child process (tests/mega/jobs_fault_worker.py, a stand-in for
`mega worker`); the test enqueues with a JobQueue of its own and reads what happened from the
worker's log and from the streams. Ack waits are 1 s so redeliveries come quickly.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from app.mega.context import BusAdapter, Context
from app.mega.job import Job
from app.mega.jobqueue import JobQueue
from tests.mega.jobs_fault_worker import fault_job

PROJECT_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 15.0
ACK_WAIT_S = 1.0


def worker_command(url: str, subject: str, mode: str, log: Path, retries: int) -> list[str]:
    """The command line of one worker process.

    Once `mega worker` exists this becomes `["mega", "worker", "--config", <a config with the
    FaultJob>]`; the tests only rely on `ready` on stdout and on the log lines.
    """
    return [
        sys.executable, "-m", "tests.mega.jobs_fault_worker",
        url, subject, mode, str(log),
        "--retries", str(retries), "--ack-wait", str(ACK_WAIT_S),
    ]  # fmt: skip


class WorkerProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls, url: str, subject: str, mode: str, log: Path, retries: int = 1
    ) -> WorkerProcess:
        proc = await asyncio.create_subprocess_exec(
            *worker_command(url, subject, mode, log, retries),
            cwd=PROJECT_ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
        assert line.strip() == b"ready", f"worker did not start: {line!r}"
        return cls(proc)

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


def read_log(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


async def wait_for_log(log: Path, kind: str, count: int = 1, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(1 for entry in read_log(log) if entry[0] == kind) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} x {kind} not logged; log: {read_log(log)}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def queue(nc: NatsClient, nats_url: str) -> JobQueue:
    ctx = Context(instance_id="test", buses={"jobs": BusAdapter("jobs", nats_url, nc)})
    return JobQueue(ctx, "jobs")


def job_for(prefix: str, retries: int = 1) -> type[Job]:
    return fault_job(f"{prefix}.fault", "ok", retries, ACK_WAIT_S)


async def test_job_of_a_sigkilled_worker_is_redelivered_and_completes(
    queue: JobQueue, nats_url: str, prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    job = job_for(prefix)
    spec = await queue.ensure(job)
    hanging = await WorkerProcess.start(nats_url, spec.subject, "hang", log)
    healthy: WorkerProcess | None = None
    try:
        job_id = await queue.enqueue(job, {"n": 1})
        await wait_for_log(log, "start")
        await hanging.kill()  # SIGKILL mid-job: no ack, no nak, nothing
        healthy = await WorkerProcess.start(nats_url, spec.subject, "ok", log)
        await wait_for_log(log, "done")
    finally:
        await hanging.kill()
        if healthy is not None:
            await healthy.kill()
    entries = read_log(log)
    assert [e[:3] for e in entries] == [
        ["start", job_id, "1"],
        ["start", job_id, "2"],  # redelivered after the ack wait: the second attempt
        ["done", job_id, "2"],
    ]
    assert await _stream_size(queue, spec.stream) == 0


async def test_job_that_kills_its_worker_goes_to_the_dlq_after_retries_plus_one(
    queue: JobQueue, nats_url: str, prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    job = job_for(prefix, retries=1)
    spec = await queue.ensure(job)
    job_id = await queue.enqueue(job, {"n": 1})
    workers: list[WorkerProcess] = []
    try:
        # A supervisor restarts the worker each time the job takes it down.
        for _ in range(4):
            worker = await WorkerProcess.start(nats_url, spec.subject, "exit", log)
            workers.append(worker)
            exited = asyncio.create_task(worker.proc.wait())
            dead_lettered = asyncio.create_task(wait_for_log(log, "dlq"))
            finished, _ = await asyncio.wait(
                [exited, dead_lettered], return_when=asyncio.FIRST_COMPLETED, timeout=15
            )
            for task in (exited, dead_lettered):
                task.cancel()
            if dead_lettered in finished and not dead_lettered.cancelled():
                break
            assert exited in finished, "the worker neither crashed nor dead-lettered the job"
            assert worker.proc.returncode == 3
    finally:
        for worker in workers:
            await worker.kill()
    starts = [e for e in read_log(log) if e[0] == "start"]
    assert [e[2] for e in starts] == ["1", "2"]  # retries + 1 runs, then no more
    assert len(workers) == 3  # two crashed, the third recorded it
    [record] = await queue.dlq.list(job)
    assert record["id"] == job_id
    assert record["error"]["type"] == "WorkerCrashed"
    assert record["attempts"] == 2
    assert record["payload"] == {"n": 1}
    assert await _stream_size(queue, spec.stream) == 0


async def test_sigterm_drains_the_running_job(
    queue: JobQueue, nats_url: str, prefix: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    job = job_for(prefix)
    spec = await queue.ensure(job)
    worker = await WorkerProcess.start(nats_url, spec.subject, "slow", log)
    try:
        job_id = await queue.enqueue(job, {})
        await wait_for_log(log, "start")
        worker.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.proc.wait(), 15) == 0
    finally:
        await worker.kill()
    assert [e[:3] for e in read_log(log)] == [["start", job_id, "1"], ["done", job_id, "1"]]
    assert await _stream_size(queue, spec.stream) == 0


async def _stream_size(queue: JobQueue, stream: str) -> int:
    return int((await queue.js.stream_info(stream)).state.messages)
