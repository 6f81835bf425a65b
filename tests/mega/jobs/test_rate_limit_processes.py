"""A rate limit holds across worker processes: three `mega worker` processes share a limit of
20 starts a second (counted in Redis) over 300 jobs. No one-second window holds more than 20
starts, whichever processes made them, and every job runs exactly once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from mega import JobQueue
from tests.factories import write_config
from tests.mega.jobs import fault_jobs
from tests.mega.jobs.test_jobs_faults import (  # the fixtures too: pytest finds them here
    StartWorker,
    for_prefix,
    nc,
    queue,
    registration,
    start_worker,
)
from tests.mega.jobs.timeline import Records
from tests.settled import settled

pytestmark = pytest.mark.slow

JOBS = 300
LIMIT = 20
__all__ = ["nc", "queue", "start_worker"]


@pytest.mark.timeout(120)
async def test_three_workers_share_one_rate_limit(
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
    start_worker: StartWorker,
    queue: JobQueue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("FAULT_RECORDS", str(records))  # the workers inherit it
    config = write_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, body=registration("ThrottledJob")
    )
    job = for_prefix(fault_jobs.ThrottledJob, prefix)
    workers = [start_worker(config) for _ in range(3)]
    for worker in workers:
        await worker.ready()
    await queue.enqueue_many(job, [{"id": str(n)} for n in range(JOBS)])
    seen = Records(records)
    deadline = time.monotonic() + 60
    while len(seen.read().starts) < JOBS:
        assert time.monotonic() < deadline, f"{len(seen.starts)} of {JOBS} started"
        await asyncio.sleep(0.2)
    await settled(lambda: queue.stats(job), "the queue")  # nothing left to start again
    starts = seen.read().starts
    assert sorted(Counter(job_id for _, job_id in starts).values()) == [1] * JOBS
    assert {job_id for _, job_id in starts} == {str(n) for n in range(JOBS)}
    per_second = Counter(int(at) for at, _ in starts)
    assert max(per_second.values()) <= LIMIT, sorted(per_second.items())
    # Every file is one process's: more than one of them started jobs.
    assert len(list(records.glob("*.log"))) >= 2
    times = sorted(at for at, _ in starts)
    assert times[-1] - times[0] >= JOBS / LIMIT - 1.5  # ~15 s: the limit, not the workers
