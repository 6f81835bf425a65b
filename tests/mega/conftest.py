"""Fixtures shared by the framework's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from mega.drivers.redis.client import RedisClient
from mega.runtime.bootstrap import connect_redis


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], Redis]]:
    """Make redis.asyncio clients (`clients(url)`) that are closed after the test."""
    made: list[Redis] = []

    def make(url: str) -> Redis:
        made.append(Redis.from_url(url))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


@pytest.fixture(params=["redis", "redis-cluster"])
async def lock_clients(
    request: pytest.FixtureRequest, redis_url: str
) -> AsyncIterator[Callable[[], Awaitable[RedisClient]]]:
    """Make the clients a host makes (`await lock_clients()`, closed after the test) for a
    test's lock: on the session's Redis, then on its Redis Cluster."""
    url = redis_url
    if request.param == "redis-cluster":
        url = str(request.getfixturevalue("redis_cluster_url"))
    made: list[RedisClient] = []

    async def make() -> RedisClient:
        made.append(await connect_redis("main", url))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()
