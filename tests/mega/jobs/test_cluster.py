"""Jobs on a real three-node NATS cluster (tests/cluster.py): a stream with three replicas
keeps every PubAck'd job while its leader node is SIGKILLed under load and later restarted,
and the `mega worker` processes ride through the failover without a restart."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from mega import JobQueue
from mega.config import load_config
from mega.drivers.nats import NatsBus
from mega.drivers.nats.names import stream_name
from mega.drivers.redis.client import RedisClient
from mega.runtime.bootstrap import boot, shutdown
from tests.cluster import NatsCluster
from tests.factories import write_config
from tests.mega.jobs import fault_jobs
from tests.mega.jobs.test_jobs_faults import for_prefix, registration
from tests.settled import settled

ROOT = Path(__file__).resolve().parents[3]
JOBS = 5_000
TIMEOUT_S = 60.0


async def until(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_an_r3_stream_loses_no_job_when_its_leader_is_killed(
    cluster: NatsCluster, tmp_path: Path, redis_url: str, prefix: str
) -> None:
    body = registration("ClusterJob")
    path = write_config(tmp_path, nats_url=cluster.url, redis_url=redis_url, body=body)
    config = load_config(path)
    ctx = await boot(config, role="test", database=False)
    redis: RedisClient = ctx.cache("main").native
    job = for_prefix(fault_jobs.ClusterJob, prefix)
    queue = JobQueue(ctx, "jobs")
    workers: list[subprocess.Popen[bytes]] = []
    try:
        assert isinstance(queue.bus, NatsBus)
        spec = await queue.ensure(job)
        info = await queue.bus.js.stream_info(stream_name(spec.subject))
        assert info.config.num_replicas == 3 and info.cluster is not None
        ids = [f"c{n:05d}" for n in range(JOBS)]
        for start in range(0, JOBS, 1000):  # every id PubAck'd by the cluster
            await queue.enqueue_many(job, [{"id": job_id} for job_id in ids[start : start + 1000]])
        command = [sys.executable, "-m", "mega", "worker", "--config", str(path)]
        for n in (1, 2):
            with open(tmp_path / f"worker{n}.log", "wb") as log:
                env = {**os.environ, "FAULT_PREFIX": prefix}
                worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
                workers.append(worker)

        async def done_at_least(count: int) -> bool:
            return await redis.hlen(f"{prefix}:done") >= count

        await until(lambda: done_at_least(1000), "1,000 jobs done")
        info = await queue.bus.js.stream_info(stream_name(spec.subject))
        assert info.cluster is not None
        leader = info.cluster.leader
        assert leader is not None
        cluster.node(leader).kill()  # SIGKILL the stream's leader under load
        await until(lambda: done_at_least(3000), "3,000 jobs done without the old leader")
        cluster.node(leader).start()  # back, it catches up from its peers
        await until(lambda: done_at_least(JOBS), "every job done")
        await settled(lambda: queue.stats(job), "the queue")  # nothing left to run again
        done = {key: int(n) for key, n in (await redis.hgetall(f"{prefix}:done")).items()}
        assert set(done) == set(ids), f"lost: {len(set(ids) - set(done))}"
        twice = [job_id for job_id, n in done.items() if n > 1]
        # Duplicates only among what was in flight at the failover (20 delivered at a time).
        assert len(twice) <= 2 * job.concurrency and max(done.values()) <= 2, len(twice)
        assert all(worker.poll() is None for worker in workers), "a worker died"
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(30)
        await shutdown(ctx)
    logs = "".join((tmp_path / f"worker{n}.log").read_text() for n in (1, 2))
    assert "Traceback" not in logs, logs[-3000:]
