"""The one place mega makes a Redis client: the redis bus's, and (through
mega.runtime.bootstrap) each cache's, which the locks, rate limits and inboxes use.

`redis://`, `rediss://` (TLS) and `unix://` name one server: a `redis.asyncio.Redis`.
`redis+cluster://host:port[,host:port...]` (`rediss+cluster://` over TLS) names a Redis Cluster
by some of its nodes: a `redis.asyncio.cluster.RedisCluster`, which asks them for the map of
the slots and sends each command to the master serving its keys' slot. A script or a
transaction must find all its keys in one slot: the keys mega writes together share a hash tag
(the `{...}` part of their names, which alone picks the slot); see mega/drivers/redis/scripts.py.
`redis+sentinel://host:port[,host:port...]/service[/db]` names a primary with replicas under
Redis Sentinel: a `redis.asyncio.Redis` whose connections ask the sentinels where the primary
of `service` is; after a failover, a connection to the old primary fails (or is told it is a
read-only replica now) and the next one goes to the new primary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, PipelineCommand, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, RedisError

from mega.constants import (
    CONNECT_TIMEOUT_S,
    HOW_TO_GET_SERVICES,
    REDIS_CLUSTER_MAX_CONNECTIONS,
    REDIS_MAX_CONNECTIONS,
)
from mega.drivers.redis.urls import (
    REDIS_CLUSTER_SCHEMES,
    REDIS_SENTINEL_SCHEMES,
    read_redis_cluster_url,
    read_redis_sentinel_url,
)
from mega.errors import DependencyUnavailable

# What `connect_redis` returns, and their pipelines: most commands are the same on both; a
# Cluster's pipeline sends each command to its slot's master (a transaction's keys must share
# one slot).
RedisClient = Redis | RedisCluster
RedisPipeline = Pipeline | ClusterPipeline
# What a call raises when Redis is away. A Cluster's client raises some that are no RedisError
# (SlotNotCoveredError while a slot has no master, during a failover).
OUTAGES = (RedisError, RedisClusterException, OSError)


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0] in REDIS_CLUSTER_SCHEMES


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Sentinel's pool (each new connection asks where the primary is) that waits for a free
    connection past its size, as the one-server pool does, instead of failing."""


async def connect_redis(alias: str, url: str, *, decode_responses: bool) -> RedisClient:
    """A client for `url`, checked with a PING (bounded); DependencyUnavailable names the URL
    when it does not answer. One server, or the primary under Sentinel: on a pool of at most
    REDIS_MAX_CONNECTIONS. A Cluster: at most REDIS_CLUSTER_MAX_CONNECTIONS to each node."""
    client: RedisClient
    if url.partition("://")[0] in REDIS_SENTINEL_SCHEMES:
        client = _sentinel_primary(url, decode_responses=decode_responses)
    elif is_cluster_url(url):
        parts = read_redis_cluster_url(url)
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in parts.nodes],
            username=parts.username,
            password=parts.password,
            ssl=parts.tls,
            max_connections=REDIS_CLUSTER_MAX_CONNECTIONS,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=CONNECT_TIMEOUT_S,
            health_check_interval=15,
            decode_responses=decode_responses,
        )
    else:
        # A burst beyond the pool (300 enqueues gathered at once) waits for a free connection,
        # instead of failing with "Too many connections".
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=REDIS_MAX_CONNECTIONS,
            timeout=CONNECT_TIMEOUT_S,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=CONNECT_TIMEOUT_S,
            health_check_interval=15,
            decode_responses=decode_responses,
        )
        client = Redis.from_pool(pool)  # aclose() closes the pool too
    try:
        await asyncio.wait_for(client.ping(), CONNECT_TIMEOUT_S)
    except Exception as exc:
        await client.aclose()
        raise DependencyUnavailable(
            "redis",
            f"cannot reach Redis {alias!r} at {url} ({_reason(exc)}); {HOW_TO_GET_SERVICES}",
        ) from exc
    return client


class SentinelPrimary(Redis):
    """The primary's client under Sentinel; closing it closes its connections to the
    sentinels too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool = self.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


def _sentinel_primary(url: str, *, decode_responses: bool) -> Redis:
    parts = read_redis_sentinel_url(url)
    timeouts = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": CONNECT_TIMEOUT_S}
    sentinels = Sentinel(list(parts.sentinels), sentinel_kwargs=timeouts)  # type: ignore[no-untyped-call]
    client: Redis = sentinels.master_for(
        parts.service,
        redis_class=SentinelPrimary,
        connection_pool_class=BlockingSentinelPool,
        db=parts.db,
        username=parts.username,
        password=parts.password,
        ssl=parts.tls,
        max_connections=REDIS_MAX_CONNECTIONS,
        timeout=CONNECT_TIMEOUT_S,  # the wait for a free connection
        health_check_interval=15,
        decode_responses=decode_responses,
        **timeouts,
    )
    return client


class NodePipeline:
    """Commands for one node of a Cluster, sent in order on one of its connections: what a
    WAIT must follow, since it counts the replicas that have every write of its own connection.
    A ClusterPipeline picks each command's node itself and, after a connection error, sends
    the commands again on new connections, where a keyless WAIT would confirm writes it never
    followed. Only raw commands (`execute_command`); the first error is raised."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.commands: list[PipelineCommand] = []

    def execute_command(self, *args: Any) -> None:
        self.commands.append(PipelineCommand(len(self.commands), *args))

    async def execute(self) -> list[Any]:
        await self.node.execute_pipeline(self.commands)
        for command in self.commands:
            if isinstance(command.result, Exception):
                raise command.result
        return [command.result for command in self.commands]


async def queue_script(
    pipe: RedisPipeline | NodePipeline,
    script: AsyncScript,
    keys: Sequence[Any],
    args: Sequence[Any],
) -> None:
    """Queue a run of `script` on `pipe`. One server: EVALSHA, the pipeline loading the script
    first where the server lacks it. A Cluster's pipeline refuses EVALSHA (it cannot load the
    script on the keys' master first): EVAL with the script's text, which the master caches."""
    if isinstance(pipe, Pipeline):
        await script(keys=keys, args=args, client=pipe)
    else:
        pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
