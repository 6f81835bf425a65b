"""A durable Job on the redis driver (`durable = True`): enqueue returns once a replica has the
job (WAIT 1 on the connection of the writes). On the session's Redis Cluster (a replica per
master) the replica of the lane's master has every job when enqueue returns; on the session's
single Redis, which has no replica, the enqueue fails with the sentence that says why. What a
failover does to durable and non-durable jobs: tests/mega/jobs/test_redis_failover.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from mega import Context, Job, JobQueue
from mega.config import load_config
from mega.drivers.redis.scripts import JOB_KEY_PREFIX
from mega.errors import DependencyUnavailable
from mega.jobs.spec import job_lane
from mega.lanes.dlq import make_record
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs.test_contract import REDIS_BUS


class Durable(Job):
    bus = "jobs"
    durable = True

    async def run(self, payload: Any, ctx: Context) -> None:
        return None


async def booted(tmp_path: Path, nats_url: str, redis_url: str) -> Context:
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=REDIS_BUS)
    return await boot(load_config(config), role="test", database=False)


@pytest.fixture
async def cluster_ctx(
    tmp_path: Path, nats_url: str, redis_cluster_url: str
) -> AsyncIterator[Context]:
    ctx = await booted(tmp_path, nats_url, redis_cluster_url)
    yield ctx
    await shutdown(ctx)


async def test_a_durable_enqueue_returns_once_the_replica_has_the_job(
    cluster_ctx: Context, prefix: str
) -> None:
    job = type("Durable", (Durable,), {"subject": f"{prefix}.durable"})
    fair = type("DurableFair", (Durable,), {"subject": f"{prefix}.fair", "fair": True})
    queue = JobQueue(cluster_ctx, "jobs")
    await queue.enqueue(job, {"n": 0})
    await queue.enqueue(job, {"n": 1}, id=f"{prefix}-dedup", delay=60)  # the ENQUEUE script
    await queue.enqueue_many(job, [{"n": n} for n in range(2, 100)])
    await queue.enqueue(fair, {"n": 0}, key="a")  # FAIR_PUSH
    client = cluster_ctx.bus("jobs").native
    assert isinstance(client, RedisCluster)
    stream = f"{JOB_KEY_PREFIX}{{{prefix}.durable}}"
    master = client.get_node_from_key(stream)
    info = await client.info("replication", target_nodes=master)
    async with Redis(host=info["slave0"]["ip"], port=info["slave0"]["port"]) as replica:
        await replica.readonly()
        assert await replica.xlen(stream) == 99  # and the delayed one waits in its sorted set
        assert await replica.zcard(f"{JOB_KEY_PREFIX}{{{prefix}.durable}}:scheduled") == 1


async def test_a_durable_requeue_returns_once_the_replica_has_the_job_again(
    cluster_ctx: Context, prefix: str
) -> None:
    job = type("Durable", (Durable,), {"subject": f"{prefix}.requeued"})
    queue = JobQueue(cluster_ctx, "jobs")
    job_id = await queue.enqueue(job, {"n": 7})
    await dead_letter_one(cluster_ctx, queue, job, job_id)
    stream = f"{JOB_KEY_PREFIX}{{{prefix}.requeued}}"
    client = cluster_ctx.bus("jobs").native
    assert isinstance(client, RedisCluster)
    info = await client.info("replication", target_nodes=client.get_node_from_key(stream))
    async with Redis(host=info["slave0"]["ip"], port=info["slave0"]["port"]) as replica:
        await replica.readonly()
        before = await replica.xlen(stream)
        assert await queue.dlq.requeue(job, job_id) == 1
        # The new entry and the record's deletion, in one script, are on the replica.
        assert await replica.xlen(stream + ":dlq") == 0
        entries = await replica.xrevrange(stream, count=1)
        assert entries is not None
        [(_, fields)] = entries
        assert fields is not None
        assert (fields[b"id"], fields[b"base"]) == (job_id.encode(), b"0")
        assert await replica.xlen(stream) == before + 1


async def dead_letter_one(ctx: Context, queue: JobQueue, job: type[Job], job_id: str) -> None:
    """Fetch the lane's one job and dead-letter it, as a worker does after its last attempt."""
    receiver = ctx.bus("jobs").receiver(job_lane(queue.spec(job)), consumer="test")
    try:
        [delivery] = await receiver.fetch(1)
        record = make_record(
            delivery.subject,
            job_id,
            {"n": 7},
            "Boom",
            "dead on purpose",
            attempts=delivery.attempt,
            first_enqueued_at=delivery.enqueued_at_ms,
            worker="test",
        )
        await receiver.dead_letter(delivery, record, terminate=False)
    finally:
        await receiver.close()


async def test_a_durable_enqueue_without_a_replica_says_the_job_may_be_lost(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    ctx = await booted(tmp_path, nats_url, redis_url)
    try:
        job = type("Durable", (Durable,), {"subject": f"{prefix}.durable"})
        queue = JobQueue(ctx, "jobs")
        job_id = f"{prefix}-unconfirmed"
        with pytest.raises(DependencyUnavailable) as caught:
            await queue.enqueue(job, {"n": 7}, id=job_id)
        assert "written to the Redis primary but no replica confirmed them within 1 s" in str(
            caught.value
        )
        assert "Enqueue again with the same id to be sure" in str(caught.value)
        # Written all the same; dead-lettered, its requeue waits for a replica too.
        await dead_letter_one(ctx, queue, job, job_id)
        with pytest.raises(DependencyUnavailable, match="no replica confirmed them"):
            await queue.dlq.requeue(job, job_id)
    finally:
        await shutdown(ctx)
