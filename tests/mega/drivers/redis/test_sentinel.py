"""The redis driver and the caches on a primary with a replica under Sentinel
(`redis+sentinel://`): real valkey servers and sentinels (EmbeddedRedisSentinel). The client asks
the sentinels where the primary is, a durable enqueue returns once the replica has its jobs,
and after the primary's death the next calls go to the replica the sentinels promoted. The
primary killed under 5,000 jobs: tests/mega/jobs/test_redis_failover.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from mega import JobQueue
from mega.drivers.redis.bus import RedisBus
from mega.drivers.redis.client import OUTAGES, connect_redis
from mega.drivers.redis.embedded import EmbeddedRedisSentinel
from mega.drivers.redis.scripts import JOB_KEY_PREFIX
from mega.errors import DependencyUnavailable
from mega.runtime.bootstrap import shutdown
from mega.settings import BusSpec
from tests.mega.drivers.redis.test_durable import Durable, booted

FAILOVER_TIMEOUT_S = 30.0  # down after 1 s, then the vote and the promotion: 2-3 s here


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[EmbeddedRedisSentinel]:
    servers = EmbeddedRedisSentinel(data_dir=tmp_path / "sentinel").start()
    yield servers
    servers.stop()


async def test_a_durable_enqueue_under_sentinel_is_on_the_replica_when_it_returns(
    sentinel: EmbeddedRedisSentinel, tmp_path: Path, nats_url: str, prefix: str
) -> None:
    ctx = await booted(tmp_path, nats_url, sentinel.url)  # the caches on the sentinels too
    try:
        job = type("Durable", (Durable,), {"subject": f"{prefix}.durable"})
        queue = JobQueue(ctx, "jobs")
        await queue.enqueue_many(job, [{"n": n} for n in range(100)])
        stats = await queue.stats(job)
        assert (stats.pending, stats.in_flight) == (100, 0)
        primary, replica = sentinel.servers
        assert sentinel.primary_port() == primary.port
        async with Redis(port=replica.port) as client:
            assert await client.xlen(f"{JOB_KEY_PREFIX}{{{prefix}.durable}}") == 100
    finally:
        await shutdown(ctx)


async def test_the_client_follows_the_sentinels_to_the_promoted_replica(
    sentinel: EmbeddedRedisSentinel,
) -> None:
    client = await connect_redis("main", sentinel.url, decode_responses=True)
    try:
        await client.set("before", "1")
        killed = sentinel.kill_primary()
        (replica,) = (server for server in sentinel.servers if server is not killed)
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while True:
            try:
                await client.set("after", "2")
                break
            except OUTAGES:
                assert time.monotonic() < deadline, "no primary took the writes again"
                await asyncio.sleep(0.1)  # calls fail while the sentinels vote: retry
        assert sentinel.primary_port() == replica.port
        assert (await client.info("server"))["tcp_port"] == replica.port
        assert await client.mget("before", "after") == ["1", "2"]
        sentinel.restart_as_replica(killed)
        async with Redis(port=killed.port) as back:
            deadline = time.monotonic() + FAILOVER_TIMEOUT_S
            while (await back.info("replication"))["role"] != "slave":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
    finally:
        await client.aclose()


async def test_connect_names_the_url_when_no_sentinel_answers() -> None:
    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mega"
    with pytest.raises(DependencyUnavailable) as caught:
        await RedisBus.connect("jobs", BusSpec(driver="redis", url=url))
    assert caught.value.dependency == "redis"
    assert f"cannot reach Redis 'jobs' at {url} (" in caught.value.message
