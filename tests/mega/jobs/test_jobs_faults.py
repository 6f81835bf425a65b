"""Process-level faults of the job-consumer host: SIGKILL mid-run, a job that kills its process,
SIGTERM with jobs in flight; and cancel and pause across two worker processes.

The workers are real `mega worker` processes (`python -m mega worker --config <file>`), run
as a user or a process manager runs them, with the jobs of tests/mega/jobs/fault_jobs.py. The test
enqueues with a JobQueue of its own and reads what happened from Redis (see fault_jobs) and from
the streams. Ack waits are 1 s so that redeliveries come quickly.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import cast

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError
from redis.asyncio import Redis

from mega.context import Context
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import HEADER_JOB_ID, stream_name
from mega.jobs.job import Job
from mega.jobs.queue import JobQueue
from mega.jobs.spec import JobSpec
from mega.lanes.control import Cancelled
from mega.settings import BusSpec
from tests.factories import write_config
from tests.mega.jobs import fault_jobs
from tests.processes import unmeasured_env
from tests.settled import settled

ROOT = Path(__file__).resolve().parents[3]
# Booting a host (imports, NATS and Redis connections, streams) takes about a second.
READY_TIMEOUT_S = 10.0
# Every wait for an outcome gives up after this: a failure must not hang the suite.
OUTCOME_TIMEOUT_S = 15.0
POLL_S = 0.02


def registration(job: str) -> str:
    """The config's body: one job of tests/mega/jobs/fault_jobs.py."""
    return f"from tests.mega.jobs.fault_jobs import {job}\njobs = [{job}]\n"


def for_prefix(job: type[Job], prefix: str) -> type[Job]:
    """The job class as the workers see it: this process imported fault_jobs without the
    test's FAULT_PREFIX, so it enqueues through a subclass on the test's subject."""
    name = job.subject.removeprefix(f"{fault_jobs.PREFIX}.")
    return type(job.__name__, (job,), {"subject": f"{prefix}.{name}"})


class MegaWorker:
    """One `mega worker` process, unmeasured (the fault tests SIGKILL them: unmeasured_env);
    its output goes to a log file read back on failure. `launch` wraps its command (e.g. to
    run it in a network namespace); `env` adds variables."""

    def __init__(
        self,
        config: Path,
        prefix: str,
        log: Path,
        *,
        launch: Callable[[list[str]], list[str]] = list,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log = log
        command = [sys.executable, "-m", "mega", "worker", "--config", str(config)]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                launch(command),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**unmeasured_env(), "FAULT_PREFIX": prefix, **(env or {})},
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def ready(self) -> MegaWorker:
        """Wait for the host's "consuming" line: streams ensured, consume loops running."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while " consuming " not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mega worker did not start:\n{self.output()}")
            await asyncio.sleep(POLL_S)
        return self

    async def exit_code(self, timeout_s: float = OUTCOME_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout_s
        while (code := self.proc.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"mega worker {self.pid} did not exit:\n{self.output()}")
            await asyncio.sleep(POLL_S)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


StartWorker = Callable[[Path], MegaWorker]


def logged_counts(output: str, job_id: str) -> set[tuple[str, int]]:
    """(signal, attempt) of each signal line the workers logged for `job_id` (`attempts` for
    a dlq line): what an operator reads in the terminal."""
    found = re.findall(rf"\b(\w+) job=\S+ id={re.escape(job_id)} attempts?=(\d+)\b", output)
    return {(name, int(count)) for name, count in found}


@pytest.fixture
def start_worker(prefix: str, tmp_path: Path) -> Iterator[StartWorker]:
    """Start a `mega worker` on a config (`await worker.ready()` to wait until it consumes);
    every process still running at the end of the test is killed."""
    started: list[MegaWorker] = []

    def start(config: Path) -> MegaWorker:
        worker = MegaWorker(config, prefix, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
def queue(nc: NatsClient, nats_url: str) -> JobQueue:
    ctx = Context(
        instance_id="test",
        buses={"jobs": NatsBus("jobs", BusSpec(driver="nats", url=nats_url), nc)},
    )
    return JobQueue(ctx, "jobs")


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def enqueue_all(queue: JobQueue, job: type[Job], count: int) -> list[str]:
    """`count` jobs, each with its id in the payload too (the job keys its effect on it)."""
    ids = [f"j{n:03d}" for n in range(count)]
    await asyncio.gather(*(queue.enqueue(job, {"id": job_id}, id=job_id) for job_id in ids))
    return ids


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + OUTCOME_TIMEOUT_S
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL_S)


async def stream_size(queue: JobQueue, stream: str) -> int:
    assert isinstance(queue.bus, NatsBus)
    return int((await queue.bus.js.stream_info(stream)).state.messages)


async def job_ids_in(queue: JobQueue, spec: JobSpec) -> set[str]:
    """The jobs still in the work-queue stream, waiting or delivered and unacked: the broker
    deletes a message once it is acked."""
    assert isinstance(queue.bus, NatsBus)
    ids: set[str] = set()
    seq = 1
    while True:
        try:
            msg = await queue.bus.js.get_msg(
                stream_name(spec.subject), seq, subject=spec.subject, next=True
            )
        except NotFoundError:
            return ids
        assert msg.headers is not None and msg.seq is not None
        ids.add(msg.headers[HEADER_JOB_ID])
        seq = msg.seq + 1


# `redis` decodes its answers (decode_responses=True): its keys and values are str.
async def keys_of(redis: Redis, key: str) -> set[str]:
    return set(cast("list[str]", await redis.hkeys(key)))


async def counts_of(redis: Redis, key: str) -> dict[str, int]:
    found = cast("dict[str, str]", await redis.hgetall(key))
    return {job_id: int(n) for job_id, n in found.items()}


@pytest.mark.slow
@pytest.mark.timeout(30)
async def test_sigkilled_worker_loses_nothing_and_reruns_only_its_in_flight_jobs(
    queue: JobQueue,
    redis: Redis,
    start_worker: StartWorker,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
) -> None:
    config = write_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, body=registration("BusyJob")
    )
    job = for_prefix(fault_jobs.BusyJob, prefix)
    spec = await queue.ensure(job)
    ids = await enqueue_all(queue, job, 300)

    first = await start_worker(config).ready()
    started_key = f"{prefix}:started:{first.pid}"
    await until(lambda: _at_least(redis.hlen(started_key), 100), "100 jobs started")
    first.proc.send_signal(signal.SIGKILL)  # no ack, no nak, no drain
    assert await first.exit_code() == -signal.SIGKILL
    started_by_first = await keys_of(redis, started_key)
    # Started by the killed process and not acked by it: in flight at the kill.
    in_flight_at_kill = started_by_first & await job_ids_in(queue, spec)
    assert 0 < len(in_flight_at_kill) <= job.concurrency
    assert len(started_by_first) < len(ids), "some jobs were still queued at the kill"

    second = await start_worker(config).ready()
    await until(
        lambda: _equals(stream_size(queue, stream_name(spec.subject)), 0), "every job acked"
    )
    second.proc.send_signal(signal.SIGTERM)
    assert await second.exit_code() == 0

    done = await counts_of(redis, f"{prefix}:done")
    assert set(done) == set(ids), f"lost: {set(ids) - set(done)}"  # zero missing
    ran_twice = {job_id for job_id, n in done.items() if n > 1}
    assert ran_twice <= in_flight_at_kill, f"ran twice: {ran_twice - in_flight_at_kill}"
    assert max(done.values()) <= 2
    # The second process ran what the first never finished, and nothing the first had acked.
    started_by_second = await keys_of(redis, f"{prefix}:started:{second.pid}")
    assert started_by_second >= set(ids) - started_by_first
    assert started_by_second & started_by_first <= in_flight_at_kill
    # And each job's record says so: the first acked none before its `done` was sent, so the
    # jobs it acked just before the kill do not say `running` for good.
    statuses = await asyncio.gather(*(queue.status(job, job_id) for job_id in ids))
    states = Counter(None if status is None else status.state for status in statuses)
    assert states == {"done": len(ids)}


@pytest.mark.slow
@pytest.mark.timeout(30)
async def test_job_that_kills_its_worker_goes_to_the_dlq_after_retries_plus_one_runs(
    queue: JobQueue,
    redis: Redis,
    start_worker: StartWorker,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
) -> None:
    config = write_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, body=registration("CrashJob")
    )
    job = for_prefix(fault_jobs.CrashJob, prefix)
    spec = await queue.ensure(job)
    fleet = [await start_worker(config).ready(), await start_worker(config).ready()]
    job_id = await queue.enqueue(job, {"id": "crash-1"}, id="crash-1")

    # A process manager (systemd, supervisord, Kubernetes) restarts every worker that dies.
    exit_codes: list[int] = []
    deadline = time.monotonic() + OUTCOME_TIMEOUT_S
    while not await queue.dlq.count(job):
        assert time.monotonic() < deadline, f"no DLQ record; worker exits: {exit_codes}"
        for n, worker in enumerate(fleet):
            if (code := worker.proc.poll()) is not None:
                exit_codes.append(code)
                fleet[n] = start_worker(config)  # no waiting: keep watching the others
        await asyncio.sleep(POLL_S)

    await settled(lambda: queue.stats(job), "the queue")  # nothing left to deliver again
    runs = await counts_of(redis, f"{prefix}:runs")
    assert runs == {job_id: job.retries + 1}  # then no more: no crash loop
    assert exit_codes == [1] * (job.retries + 1)  # each run ended its process, os._exit(1)
    for worker in fleet:
        await worker.ready()  # the fleet keeps running: restarted, and not crash-looping
    [record] = await queue.dlq.list(job)
    assert record["id"] == job_id
    assert record["error"]["type"] == "WorkerCrashed"
    assert record["attempts"] == job.retries + 1
    # The delivery after the last attempt is no attempt: the terminal counts as the record.
    output = "".join(log.read_text(errors="replace") for log in tmp_path.glob("worker-*.log"))
    last = job.retries + 1
    assert {("fail", last), ("dlq", last)} <= logged_counts(output, job_id), output[-3000:]
    assert max(count for _, count in logged_counts(output, job_id)) == last
    assert record["payload"] == {"id": job_id}
    # Its status: dead-lettered after its two runs, the first kept in its history as lost
    # (the run's worker died before its record went out, or with it `running`).
    status = await queue.status(job, job_id)
    assert status is not None and (status.state, status.attempts) == ("dlq", job.retries + 1)
    assert status.error is not None and status.error.type == "WorkerCrashed"
    assert [(a.attempt, a.state) for a in status.history] == [(1, "lost")]
    # The worker the record names is the one its last run killed, stored before that run
    # began (a run after the first may kill its worker again), not the one that wrote the
    # dead letter down; and the first run's worker, where its record went out before it died.
    ran_on = await redis.hgetall(f"{prefix}:ran_on")
    assert status.worker == ran_on[f"{job_id}:{last}"] != record["worker"]
    assert status.started_at is not None
    assert await stream_size(queue, stream_name(spec.subject)) == 0
    for worker in fleet:
        worker.proc.send_signal(signal.SIGTERM)
    assert [await worker.exit_code() for worker in fleet] == [0, 0]


@pytest.mark.slow
@pytest.mark.timeout(30)
async def test_sigterm_drains_in_flight_jobs_and_exits_0_losing_nothing(
    queue: JobQueue,
    redis: Redis,
    start_worker: StartWorker,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
) -> None:
    config = write_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, body=registration("SlowJob")
    )
    job = for_prefix(fault_jobs.SlowJob, prefix)
    spec = await queue.ensure(job)
    ids = await enqueue_all(queue, job, 20)

    first = await start_worker(config).ready()
    started_key = f"{prefix}:started:{first.pid}"
    await until(lambda: _at_least(redis.hlen(started_key), job.concurrency), "a full worker")
    first.proc.send_signal(signal.SIGTERM)
    assert await first.exit_code() == 0
    in_flight = await keys_of(redis, started_key)
    assert len(in_flight) == job.concurrency
    # The drain finished and acked them, and took nothing new: the rest wait in the stream.
    assert await counts_of(redis, f"{prefix}:done") == dict.fromkeys(in_flight, 1)
    assert await job_ids_in(queue, spec) == set(ids) - in_flight

    second = await start_worker(config).ready()
    await until(lambda: _equals(stream_size(queue, stream_name(spec.subject)), 0), "the rest done")
    second.proc.send_signal(signal.SIGTERM)
    assert await second.exit_code() == 0
    assert await counts_of(redis, f"{prefix}:done") == dict.fromkeys(ids, 1)  # exactly once
    assert await keys_of(redis, f"{prefix}:started:{second.pid}") == set(ids) - in_flight


async def _at_least(value: Awaitable[int], n: int) -> bool:
    return await value >= n


async def _equals(value: Awaitable[int], n: int) -> bool:
    return await value == n


# -- cancel and pause, across two processes -------------------------------------------------


async def started_by(redis: Redis, prefix: str, pids: list[int]) -> dict[str, list[int]]:
    """Job id -> the pids of the processes that started it."""
    found: dict[str, list[int]] = {}
    for pid in pids:
        for job_id in await keys_of(redis, f"{prefix}:started:{pid}"):
            found.setdefault(job_id, []).append(pid)
    return found


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_cancel_reaches_the_process_running_the_job_and_a_queued_one_never_starts(
    queue: JobQueue,
    redis: Redis,
    start_worker: StartWorker,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
) -> None:
    config = write_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, body=registration("LongJob")
    )
    job = for_prefix(fault_jobs.LongJob, prefix)
    spec = await queue.ensure(job)
    workers = [await start_worker(config).ready() for _ in range(2)]
    pids = [worker.pid for worker in workers]
    running = [await queue.enqueue(job, {"id": f"r{n}"}, id=f"r{n}") for n in range(4)]
    await until(lambda: _has(started_by(redis, prefix, pids), set(running)), "four running")
    later = await queue.enqueue(job, {"id": "later"}, id="later", delay=2)
    assert await queue.cancel(job, later) == Cancelled(True, "cancelled")

    for job_id in running[:2]:
        assert await queue.cancel(job, job_id) == Cancelled(True, "cancelled")
    holders = await started_by(redis, prefix, pids)

    async def cut_short() -> bool:
        cut = {
            job_id: pid
            for pid in pids
            for job_id in await keys_of(redis, f"{prefix}:cancelled:{pid}")
        }
        return cut == {job_id: holders[job_id][0] for job_id in running[:2]}

    await until(cut_short, "each cancel reaching the process that runs its job")
    # The delayed one came due and was dropped unrun, the two cut short were settled without
    # a retry: the stream holds only the two that run on.
    await until(lambda: _equals(stream_size(queue, stream_name(spec.subject)), 2), "two stored")
    assert await started_by(redis, prefix, pids) == holders  # nothing restarted, `later` never
    for job_id in (*running[:2], later):
        status = await queue.status(job, job_id)
        assert status is not None and status.state == "cancelled"
    for job_id in running[2:]:  # the others run on, untouched
        status = await queue.status(job, job_id)
        assert status is not None and status.state == "running"
    assert await counts_of(redis, f"{prefix}:done") == {}
    assert await stream_size(queue, stream_name(spec.subject)) == 2  # the two still running


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_pause_holds_every_process_until_the_resume(
    queue: JobQueue,
    redis: Redis,
    start_worker: StartWorker,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
) -> None:
    config = write_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, body=registration("LongJob")
    )
    job = for_prefix(fault_jobs.LongJob, prefix)
    spec = await queue.ensure(job)
    workers = [await start_worker(config).ready() for _ in range(2)]
    pids = [worker.pid for worker in workers]
    await queue.pause(job, by="test")
    await until(lambda: _logged(workers, " paused: "), "both processes paused")
    ids = [await queue.enqueue(job, {"id": f"p{n}", "sleep_s": 0}, id=f"p{n}") for n in range(6)]
    # The processes fetch into their free slots and hold what they fetched: once the lane's
    # concurrency (on NATS, what the whole fleet may hold) is held, nothing more is fetched
    # and nothing starts until the resume.
    held = job.concurrency
    await settled(lambda: queue.stats(job), "held", pending=6 - held, in_flight=held)
    assert await started_by(redis, prefix, pids) == {}  # nothing started in either
    await queue.resume(job, by="test")
    await until(lambda: _done(redis, prefix, ids), "all six done after the resume")
    assert await counts_of(redis, f"{prefix}:done") == dict.fromkeys(ids, 1)
    await until(lambda: _empty(queue, stream_name(spec.subject)), "the stream empty")


async def _has(found: Awaitable[dict[str, list[int]]], ids: set[str]) -> bool:
    return set(await found) == ids


async def _logged(workers: list[MegaWorker], text: str) -> bool:
    return all(text in worker.output() for worker in workers)


async def _done(redis: Redis, prefix: str, ids: Sequence[str]) -> bool:
    return set(await counts_of(redis, f"{prefix}:done")) == set(ids)


async def _empty(queue: JobQueue, stream: str) -> bool:
    return await stream_size(queue, stream) == 0
