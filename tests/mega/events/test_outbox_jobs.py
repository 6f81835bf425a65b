"""`outbox.enqueue`: a job written in the caller's transaction, enqueued by the relay after the
commit, on every bus driver. A rolled-back transaction leaves nothing; a committed job runs
once, also when the relay dies after its enqueue and before it marks the row (the job id is the
dedup id): in this process on every driver, and with a relay process SIGKILLed there on the
drivers whose jobs outlive a process (the memory driver's do not)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from mega import Context, Job, JobQueue, JobRunner, outbox
from mega.config import Config, load_config
from mega.drivers.redis.client import RedisClient
from mega.errors import JobError
from mega.runtime import OutboxRelay
from mega.runtime.bootstrap import boot, shutdown
from mega.transactional import outbox_rows
from tests.factories import write_config
from tests.mega.events import fault_events
from tests.mega.jobs.test_contract import DRIVERS, bus_body
from tests.settled import settled

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 20.0
JOBS = "from tests.mega.events.fault_events import Shipped\njobs = [Shipped]\n"


@pytest.fixture(params=DRIVERS)
async def setup(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Config, Context, type[Job], JobQueue, RedisClient]]:
    monkeypatch.setenv("FAULT_PREFIX", prefix)
    body = bus_body(request) + JOBS
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    ctx = await boot(config, role="test")  # the database migrated: the outbox table is there
    job = type("Shipped", (fault_events.Shipped,), {"subject": f"{prefix}.shipped"})
    queue = JobQueue(ctx, "jobs")
    assert queue.bus.driver == request.param
    yield config, ctx, job, queue, ctx.cache("main").native
    await shutdown(ctx)


# `...`: a check binds its loop variable as a defaulted parameter (`lambda group=group: ...`),
# which mypy cannot match against `Callable[[], ...]`.
async def until(check: Callable[..., Any], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def runs(redis: RedisClient, prefix: str) -> dict[str, int]:
    found = await redis.hgetall(f"{prefix}:jobs")
    return {_text(key): int(value) for key, value in found.items()}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def running(ctx: Context, job: type[Job]) -> JobRunner:
    worker = JobRunner(ctx)
    worker.register(job)
    await worker.start()
    return worker


async def test_the_job_exists_if_and_only_if_its_transaction_commits(
    setup: Any, prefix: str
) -> None:
    _config, ctx, job, queue, redis = setup

    def rolled_back(session: Any) -> None:
        outbox.enqueue(session, job, {"order": 1}, id=f"{prefix}-rolled")
        raise RuntimeError("the order is refused after all: roll back")

    with pytest.raises(RuntimeError):
        await ctx.db.run(rolled_back)
    with pytest.raises(JobError) as bad:  # checked at once, in the caller's transaction
        await ctx.db.run(lambda session: outbox.enqueue(session, job, {"x": 1}, id="two words"))
    assert bad.value.code == "job.invalid_id"

    def committed(session: Any) -> list[str]:
        return [
            outbox.enqueue(session, job, {"order": 2}),
            outbox.enqueue(session, job, {"order": 3}, id=f"{prefix}-given", key="tenant-a"),
            outbox.enqueue(session, job, {"order": 4}, delay=1.0),
        ]

    started = time.monotonic()
    ids = await ctx.db.run(committed)
    assert ids[1] == f"{prefix}-given"
    assert (await ctx.db.run(outbox.stats)).pending == 3
    assert (await queue.stats(job)).pending == 0  # nothing enqueued before the relay
    worker = await running(ctx, job)
    try:
        assert await OutboxRelay(ctx, jobs=[job]).relay_once() == 3
        assert (await ctx.db.run(outbox.stats)).pending == 0
        await until(lambda: _ran(redis, prefix, ids), "the three jobs")
        assert time.monotonic() - started >= 0.9  # the delayed one counted from its enqueue
        found = await runs(redis, prefix)
        assert found == dict.fromkeys(ids, 1)  # the rolled-back one never ran
        for job_id in ids:
            await until(lambda job_id=job_id: _state(queue, job, job_id, "done"), "done")
    finally:
        await worker.stop(5)


async def test_a_relay_failing_after_its_enqueue_runs_nothing_twice(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay enqueues the batch, then cannot mark the rows (the database went away): the
    next batch enqueues the same jobs again, and the bus drops the copies (same job ids)."""
    _config, ctx, job, queue, redis = setup
    ids = await ctx.db.run(
        lambda session: [outbox.enqueue(session, job, {"n": n}) for n in range(20)]
    )
    worker = await running(ctx, job)
    try:
        marks = outbox_rows.mark_published

        def lost(*args: Any, **kwargs: Any) -> None:
            raise ConnectionError("the database went away before the mark")

        monkeypatch.setattr(outbox_rows, "mark_published", lost)
        with pytest.raises(ConnectionError):
            await OutboxRelay(ctx, jobs=[job]).relay_once()
        await until(lambda: _ran(redis, prefix, ids), "the first enqueue's runs")
        assert (await ctx.db.run(outbox.stats)).pending == 20  # nothing was marked
        monkeypatch.setattr(outbox_rows, "mark_published", marks)
        assert await OutboxRelay(ctx, jobs=[job]).relay_once() == 20
        await settled(lambda: queue.stats(job), "the queue")  # a stored copy would have run
        assert await runs(redis, prefix) == dict.fromkeys(ids, 1)
        assert (await ctx.db.run(outbox.stats)).pending == 0
    finally:
        await worker.stop(5)


@pytest.mark.slow
async def test_a_relay_killed_after_its_enqueue_runs_nothing_twice(setup: Any, prefix: str) -> None:
    """A relay process SIGKILLed after every job of its batch was stored and before it marked
    the rows: the next relay enqueues them again, and each job runs once."""
    config, ctx, job, queue, redis = setup
    if queue.bus.driver == "memory":
        pytest.skip("the memory driver's jobs live in one process: no relay elsewhere")
    ids = await ctx.db.run(
        lambda session: [outbox.enqueue(session, job, {"n": n}) for n in range(50)]
    )
    killed = subprocess.run(
        [sys.executable, "-m", "tests.mega.events.relay_process", str(config.path), "after_puback"],
        cwd=ROOT,
        env={**os.environ, "FAULT_PREFIX": prefix},
        capture_output=True,
        timeout=60,
    )
    assert killed.returncode == -9, killed.stderr.decode()
    assert (await ctx.db.run(outbox.stats)).pending == 50  # nothing was marked
    assert (await queue.stats(job)).pending == 50  # and every job was stored
    worker = await running(ctx, job)
    try:
        assert await OutboxRelay(ctx, jobs=[job]).relay_once() == 50
        await until(lambda: _ran(redis, prefix, ids), "the jobs")
        await settled(lambda: queue.stats(job), "the queue")  # a stored copy would have run
        assert await runs(redis, prefix) == dict.fromkeys(ids, 1)
    finally:
        await worker.stop(5)


async def test_a_relay_leaves_a_job_it_does_not_know_for_one_that_does(
    setup: Any, prefix: str
) -> None:
    _config, ctx, job, queue, _redis = setup
    await ctx.db.run(lambda session: outbox.enqueue(session, job, {"n": 1}))
    assert await OutboxRelay(ctx).relay_once() == 0  # its config declares no jobs
    assert (await ctx.db.run(outbox.stats)).pending == 1
    assert (await queue.stats(job)).pending == 0
    assert await OutboxRelay(ctx, jobs=[job]).relay_once() == 1


async def _ran(redis: RedisClient, prefix: str, ids: list[str]) -> bool:
    found = await runs(redis, prefix)
    return all(found.get(job_id, 0) >= 1 for job_id in ids)


async def _state(queue: JobQueue, job: type[Job], job_id: str, state: str) -> bool:
    status = await queue.status(job, job_id)
    return status is not None and status.state == state


async def test_a_row_over_what_its_bus_takes_stays_pending_and_holds_up_no_other(
    setup: Any, prefix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A row its bus's engine would refuse at each try (a NATS server's max_payload is 1 MB,
    the class's cap 1 MiB) is left pending, said once, and passed over: the rows after it are
    relayed. Here the engine's cap is made small, on every driver."""
    _config, ctx, job, queue, _redis = setup
    monkeypatch.setattr(type(queue.bus), "max_body_bytes", 100, raising=False)

    def rows(session: Any) -> list[str]:
        return [
            outbox.enqueue(session, job, {"n": 1}),
            outbox.enqueue(session, job, {"n": 2, "pad": "x" * 200}),
            outbox.enqueue(session, job, {"n": 3}),
        ]

    small, big, after = await ctx.db.run(rows)
    relay = OutboxRelay(ctx, jobs=[job])
    with caplog.at_level(logging.ERROR, logger="mega.relay"):
        assert await relay.relay_once() == 2
        assert await relay.relay_once() == 0  # said once, not at each batch
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith("outbox relay: row ") and ", over what bus 'jobs' takes (100)" in said
    assert (await ctx.db.run(outbox.stats)).pending == 1  # kept, never lost
    assert (await queue.stats(job)).pending == 2
    assert await queue.status(job, big) is None and await queue.status(job, small) is not None
    assert await queue.status(job, after) is not None
