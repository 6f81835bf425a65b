"""The redis and postgres bus drivers under faults, with real `mega worker` processes: a worker
SIGKILLed with jobs in flight (nothing lost, duplicates only among its in-flight jobs), a job
that kills its worker (dead-lettered after retries + 1 runs), and Redis restarted with AOF
(every acknowledged enqueue runs). The nats driver's are in test_jobs_faults.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from mega import Context, JobQueue
from mega.config import load_config
from mega.drivers.embedded import EmbeddedServer
from mega.drivers.postgres.embedded import EmbeddedPostgres
from mega.drivers.postgres.schema import JOBS as JOBS_TABLE
from mega.drivers.redis.client import RedisClient
from mega.drivers.redis.embedded import EmbeddedRedis
from mega.drivers.redis.scripts import JOB_KEY_PREFIX as KEY_PREFIX
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs import fault_jobs
from tests.mega.jobs.test_jobs_faults import (
    MegaWorker,
    counts_of,
    enqueue_all,
    for_prefix,
    keys_of,
    logged_counts,
    registration,
)
from tests.settled import settled

TIMEOUT_S = 30.0


def bus_config(job: str, driver: str, bus_url: str) -> str:
    return registration(job) + (
        f'services = {{**services, "buses": {{"jobs": {{"driver": {driver!r}, '
        f'"url": {bus_url!r}}}}}}}\n'
    )


@pytest.fixture(params=["redis", "postgres"])
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> AsyncIterator[Callable[..., Any]]:
    contexts: list[Context] = []
    workers: list[MegaWorker] = []
    driver = request.param
    default_url = redis_url if driver == "redis" else request.getfixturevalue("postgres_url")

    async def make(job: str, bus_url: str = default_url) -> tuple[Path, JobQueue, RedisClient]:
        body = bus_config(job, driver, bus_url)
        path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
        ctx = await boot(load_config(path), role="test", database=False)
        contexts.append(ctx)
        return path, JobQueue(ctx, "jobs"), ctx.cache("main").native

    def start(path: Path) -> MegaWorker:
        worker = MegaWorker(path, prefix, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker

    make.start = start  # type: ignore[attr-defined]
    make.driver = driver  # type: ignore[attr-defined]
    yield make
    for worker in workers:
        worker.kill()
    for ctx in contexts:
        await shutdown(ctx)


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def waiting(queue: Any, subject: str) -> set[str]:
    """Job ids still stored: waiting, or delivered and not acked (an ack deletes)."""
    if queue.bus.driver == "postgres":
        cursor = await queue.bus.native.execute(
            f"SELECT job_id FROM {JOBS_TABLE} WHERE lane = %s", (f"job:{subject}",)
        )
        return {job_id for (job_id,) in await cursor.fetchall()}
    entries = await queue.bus.native.xrange(KEY_PREFIX + "{" + subject + "}")
    return {fields[b"id"].decode() for _, fields in entries}


@pytest.mark.slow
async def test_a_sigkilled_worker_loses_nothing(setup: Any, prefix: str) -> None:
    path, queue, redis = await setup("BusyJob")
    job = for_prefix(fault_jobs.BusyJob, prefix)
    ids = await enqueue_all(queue, job, 300)
    first = await setup.start(path).ready()
    started_key = f"{prefix}:started:{first.pid}"

    async def hundred() -> bool:
        return bool(await redis.hlen(started_key) >= 100)

    await until(hundred, "100 jobs started")
    first.proc.send_signal(signal.SIGKILL)
    assert await first.exit_code() == -signal.SIGKILL
    started_by_first = await keys_of(redis, started_key)
    in_flight_at_kill = started_by_first & await waiting(queue, job.subject)
    # Still stored at the kill: the runs going on (`concurrency` at most) and runs that ended
    # whose ack waited for their batch of status records to be sent. Both may run again.
    running_at_kill = in_flight_at_kill - set(await counts_of(redis, f"{prefix}:done"))
    assert in_flight_at_kill and len(running_at_kill) <= job.concurrency

    second = await setup.start(path).ready()

    async def all_done() -> bool:
        return set(await counts_of(redis, f"{prefix}:done")) == set(ids)

    await until(all_done, "every job done (the dead worker's claimed after its ack wait)")
    second.proc.send_signal(signal.SIGTERM)
    assert await second.exit_code() == 0
    done = await counts_of(redis, f"{prefix}:done")
    ran_twice = {job_id for job_id, n in done.items() if n > 1}
    assert ran_twice <= in_flight_at_kill and max(done.values()) <= 2
    assert await waiting(queue, job.subject) == set()


@pytest.mark.slow
async def test_a_job_that_kills_its_worker_is_dead_lettered(setup: Any, prefix: str) -> None:
    path, queue, redis = await setup("CrashJob")
    job = for_prefix(fault_jobs.CrashJob, prefix)
    fleet = [await setup.start(path).ready()]
    await queue.enqueue(job, {"id": "crash-1"}, id="crash-1")
    exits: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not await queue.dlq.count(job):
        assert time.monotonic() < deadline, f"no DLQ record; exits {exits}"
        if (code := fleet[0].proc.poll()) is not None:  # a process manager restarts it
            exits.append(code)
            fleet[0] = setup.start(path)
        await asyncio.sleep(0.05)
    await settled(lambda: queue.stats(job), "the queue")  # nothing left to deliver again
    assert await counts_of(redis, f"{prefix}:runs") == {"crash-1": job.retries + 1}
    assert exits == [1] * (job.retries + 1)
    [record] = await queue.dlq.list(job)
    assert (record["id"], record["error"]["type"]) == ("crash-1", "WorkerCrashed")
    assert record["attempts"] == job.retries + 1
    # The delivery after the last attempt is no attempt: the terminal counts as the record.
    last = job.retries + 1
    assert {("fail", last), ("dlq", last)} <= logged_counts(fleet[0].output(), "crash-1")
    assert max(count for _, count in logged_counts(fleet[0].output(), "crash-1")) == last
    await fleet[0].ready()
    fleet[0].proc.send_signal(signal.SIGTERM)
    assert await fleet[0].exit_code() == 0


@pytest.mark.slow
async def test_the_engine_restarted_runs_every_acknowledged_enqueue(
    setup: Any, prefix: str, tmp_path: Path
) -> None:
    """Redis with its append-only file, PostgreSQL durable (fsync on)."""
    bus: EmbeddedServer = (
        EmbeddedRedis(data_dir=tmp_path / "bus", appendonly=True)
        if setup.driver == "redis"
        else EmbeddedPostgres(tmp_path / "bus")
    ).start()
    try:
        path, queue, redis = await setup("BusyJob", bus.url)
        job = for_prefix(fault_jobs.BusyJob, prefix)
        ids = await enqueue_all(queue, job, 200)  # each returned: stored (fsynced)
        bus.stop()
        bus.start()  # every enqueue is replayed from the append-only file, or the WAL
        if setup.driver == "redis":
            await queue.bus.native.connection_pool.disconnect()  # they died with it
        worker = await setup.start(path).ready()

        async def all_done() -> bool:
            return set(await counts_of(redis, f"{prefix}:done")) == set(ids)

        await until(all_done, "every enqueued job run after the restart")
        worker.proc.send_signal(signal.SIGTERM)
        assert await worker.exit_code() == 0
        assert set((await counts_of(redis, f"{prefix}:done")).values()) == {1}
    finally:
        bus.stop()
