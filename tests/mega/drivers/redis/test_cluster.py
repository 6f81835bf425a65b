"""The redis driver's key layout on a Redis Cluster (the session's: 3 masters, a replica each):
every key a job lane wrote is in the slot of the lane's stream, the lanes of different Job
classes are served by more than one master, and every key of the events side is in one slot.
The contract suites prove the behaviour on the cluster (their `redis-cluster` param)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from mega import Context, Event, EventBus, Job, JobQueue, JobRunner, Listener, ListenerRunner
from mega.config import load_config
from mega.drivers.redis import RedisBus
from mega.drivers.redis.scripts import EVENTS_LOG, JOB_KEY_PREFIX
from mega.errors import DependencyUnavailable
from mega.runtime.bootstrap import boot, shutdown
from mega.settings import BusSpec
from tests.factories import write_config
from tests.mega.jobs.test_contract import REDIS_BUS, until

# Job classes enqueued: all of them on one of the 3 masters by chance is 3 / 3**12, about one
# run in 177,000.
CLASSES = 12


class Failing(Job):
    """Fails when the payload says so: one retry, then the dead letters."""

    bus = "jobs"
    retries = 1
    backoff = {"type": "exponential", "initial": 10, "max": 10}

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        if payload.get("fail"):
            raise RuntimeError("planned failure")


class FailingListener(Listener):
    retries = 1
    backoff = {"type": "exponential", "initial": 10, "max": 10}

    async def run(self, event: Any, ctx: Context) -> None:
        raise RuntimeError("planned failure")


@pytest.fixture
async def ctx(tmp_path: Path, nats_url: str, redis_cluster_url: str) -> AsyncIterator[Context]:
    body = REDIS_BUS
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_cluster_url, body=body)
    booted = await boot(load_config(config), role="test", database=False)
    assert isinstance(booted.bus("jobs").native, RedisCluster)
    yield booted
    await shutdown(booted)


async def keys_like(client: RedisCluster, pattern: str) -> list[str]:
    """Every key matching `pattern`, on every master."""
    return [key.decode() async for key in client.scan_iter(match=pattern, count=1000)]


async def test_a_job_lanes_keys_share_its_slot_and_lanes_spread_over_the_masters(
    ctx: Context, prefix: str
) -> None:
    classes: list[type[Failing]] = [
        type(f"C{i}", (Failing,), {"subject": f"{prefix}.c{i}"}) for i in range(CLASSES)
    ]
    worker = JobRunner(ctx)
    for job in classes:
        worker.register(job)
    await worker.start()
    queue = JobQueue(ctx, "jobs")
    try:
        for job in classes:
            await queue.enqueue(job, {"fail": True})  # its retry waits in the sorted set
            await queue.enqueue(job, {}, id="once")  # a dedup key
            await queue.enqueue(job, {}, delay=600)  # waits in the sorted set

        async def all_dead() -> bool:
            return [(await queue.stats(job)).dlq for job in classes] == [1] * CLASSES

        await until(all_dead, "a dead letter in each lane", 20)
    finally:
        await worker.stop(5)

    client = ctx.bus("jobs").native
    assert isinstance(client, RedisCluster)
    masters = set()
    for job in classes:
        stream = JOB_KEY_PREFIX + "{" + job.subject + "}"
        written = await keys_like(client, stream + "*")
        kinds = {key.removeprefix(stream).split(":")[1] for key in written if key != stream}
        assert {"scheduled", "dlq", "dedup", "status", "workers"} <= kinds, written
        assert {client.keyslot(key) for key in [stream, *written]} == {client.keyslot(stream)}
        node = client.get_node_from_key(stream)
        assert node is not None
        masters.add(node.name)
    assert len(masters) > 1


async def test_every_key_of_the_events_side_is_in_one_slot(ctx: Context, prefix: str) -> None:
    signed: type[Event] = type("Signed", (Event,), {"name": f"{prefix}.signed", "bus": "jobs"})
    group: type[FailingListener] = type(
        "Audit", (FailingListener,), {"event": signed, "group": f"{prefix}-audit"}
    )
    worker = ListenerRunner(ctx)
    worker.register(group)
    await worker.start()
    bus = EventBus(ctx, "jobs")
    try:
        await bus.emit(signed, {"n": 1})

        async def dead() -> bool:
            return (await bus.stats(group)).dlq == 1

        await until(dead, "the event dead-lettered", 20)
    finally:
        await worker.stop(5)
    client = ctx.bus("jobs").native
    assert isinstance(client, RedisCluster)
    written = await keys_like(client, EVENTS_LOG + "*")  # every test's: all in the one slot
    own = f"{EVENTS_LOG}:group:{group.group}"
    assert {own, own + ":dlq", own + ":dlq:ids"} <= set(written)
    assert any(key.startswith(EVENTS_LOG + ":dedup:") for key in written)
    assert {client.keyslot(key) for key in written} == {client.keyslot(EVENTS_LOG)}


async def test_connect_names_the_url_when_no_node_of_the_cluster_answers() -> None:
    url = "redis+cluster://127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(DependencyUnavailable) as caught:
        await RedisBus.connect("jobs", BusSpec(driver="redis", url=url))
    assert caught.value.dependency == "redis"
    assert f"cannot reach Redis 'jobs' at {url} (" in caught.value.message
