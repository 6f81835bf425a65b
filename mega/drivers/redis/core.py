"""What every part of the Redis bus shares: its connection and state (`RedisCore`) and
the helpers of its parts. The parts: bus.py (the lanes), dead.py, records.py, events.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Self, cast

from redis.asyncio.cluster import RedisCluster

from mega.constants import CLOSE_TASKS_S, CONNECT_TIMEOUT_S, REDIS_DURABLE_WAIT_S
from mega.drivers.base import (
    DriverUnavailable,
    Lane,
    Table,
)
from mega.drivers.redis.client import (
    OUTAGES,
    NodePipeline,
    RedisClient,
    connect_redis,
)
from mega.drivers.redis.lanes import (
    LaneKeys,
    as_text,
)
from mega.drivers.redis.scripts import (
    DROP,
    EMIT,
    ENQUEUE,
    FAIR_PUSH,
    REQUEUE,
)
from mega.settings import BusSpec
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.drivers.redis")


class RedisCore:
    """A connection to Redis for a bus. `native` is the `redis.asyncio.Redis` client, or
    for a `redis+cluster://` URL the `redis.asyncio.cluster.RedisCluster` one (bytes in and
    out: `decode_responses=False`)."""

    driver: ClassVar[str] = "redis"
    fair_lanes: ClassVar[bool] = True
    priority_lanes: ClassVar[bool] = True

    def __init__(self, alias: str, spec: BusSpec, redis: RedisClient) -> None:
        self.alias = alias
        self.spec = spec
        self.redis = redis
        self._enqueue = redis.register_script(ENQUEUE)
        self._fair_push = redis.register_script(FAIR_PUSH)
        self._emit = redis.register_script(EMIT)
        self._drop = redis.register_script(DROP)
        self._requeue = redis.register_script(REQUEUE)
        self._tasks: set[asyncio.Task[None]] = set()  # announce_commit's, kept until done

    @property
    def native(self) -> RedisClient:
        return self.redis

    @property
    def connected(self) -> bool:
        return True  # a Redis call finds out (and the relay retries after an error)

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        url = spec.url if isinstance(spec.url, str) else ",".join(spec.url)
        return cls(alias, spec, await connect_redis(alias, url, decode_responses=False))

    async def close(self) -> None:
        await cancel_and_wait(self._tasks, CLOSE_TASKS_S)
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    async def ping(self) -> None:
        try:
            await asyncio.wait_for(self.redis.ping(), CONNECT_TIMEOUT_S)
        except (*OUTAGES, TimeoutError) as exc:
            raise DriverUnavailable(f"Redis {self.alias!r}: {_reason(exc)}") from exc

    # Durable lanes, WAIT.
    # Redis acknowledges a write before its replicas have it: a primary that dies in between
    # takes it along, and the replica promoted in its place never had it. WAIT n t blocks until
    # n replicas have every write made on the connection it is sent on (or t ms passed) and
    # answers how many do, so a durable lane's WAIT goes last on the pipeline of its writes,
    # one connection: on a Cluster, one to the master of the lane's slot (NodePipeline; every
    # key of a lane shares its hash tag). A write of the scheduler's promotion of a delayed job
    # is not waited for: the job it moves is on the replica already, in the sorted set.

    async def write(
        self, lane: Lane, keys: LaneKeys, queue: Callable[[Any], Awaitable[None]], failed: str
    ) -> list[Any]:
        """Send the writes `queue` puts on a pipeline, in one round trip; their answers. A
        durable lane's end with a WAIT (see `queue_wait`), checked here: on a Cluster, all on one
        connection to the master of the lane's slot."""
        pinned = lane.durable and isinstance(self.redis, RedisCluster)
        answers: list[Any]
        try:
            if pinned:
                master = cast(RedisCluster, self.redis).get_node_from_key(keys.stream)
                if master is None:
                    raise DriverUnavailable(f"{failed}: its slot has no master")
                node_pipe = NodePipeline(master)
                await queue(node_pipe)
                queue_wait(lane, node_pipe)
                answers = await node_pipe.execute()
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    await queue(pipe)
                    queue_wait(lane, pipe)
                    answers = await pipe.execute()
        except OUTAGES as exc:
            if pinned:  # a keyed call lets the client follow the slot to its new master
                with contextlib.suppress(*OUTAGES):
                    await self.redis.exists(keys.stream)
            raise DriverUnavailable(f"{failed}: {exc}") from exc
        if lane.durable:
            confirm_replicas(lane, answers.pop())
        return answers


def queue_wait(lane: Lane, pipe: Any) -> None:
    """A durable lane's writes end with a WAIT for one replica (see RedisBus._write)."""
    if lane.durable:
        pipe.execute_command("WAIT", 1, round(REDIS_DURABLE_WAIT_S * 1000))


def confirm_replicas(lane: Lane, replicas: Any) -> None:
    """Raise unless WAIT says a replica has the lane's new jobs: they are on the primary, but
    a failover now would lose them, and the caller was not told they were stored."""
    if int(replicas) < 1:
        raise DriverUnavailable(
            f"{lane.name} is durable: its jobs were written to the Redis primary but no replica "
            f"confirmed them within {REDIS_DURABLE_WAIT_S:g} s, so they may be lost if the "
            "primary fails now. Is a replica attached and in sync (INFO replication)? Enqueue "
            "again with the same id to be sure: it is stored once"
        )


def index_records(
    pipe: Any, keys: LaneKeys, table: Table, records: Sequence[tuple[str, bytes]], keep_ms: int
) -> None:
    """Add the keys to the table's index, scored with their expiry (epoch ms); the index
    itself lives as long as its latest record."""
    expires_ms = int(time.time() * 1000) + keep_ms
    index = keys.record_index(table)
    pipe.zadd(index, {key: expires_ms for key, _ in records})
    pipe.pexpire(index, keep_ms)


def added(info: dict[Any, Any]) -> int:
    """Entries ever added to a stream (XINFO STREAM's entries-added, Redis 7+)."""
    found = {as_text(key): value for key, value in info.items()}
    return int(found.get("entries-added") or 0)


def entry_ms(entry_id: Any) -> int:
    """When Redis stored an entry: its id's time part."""
    return int(as_text(entry_id).split("-")[0])


def enqueued_at(entry: Any) -> int:
    """An entry's `enqueued_at` field, else its id's time."""
    entry_id, fields = entry
    value = fields.get(b"enqueued_at", fields.get("enqueued_at"))
    return int(value) if value is not None else entry_ms(entry_id)


def group_info(groups: list[dict[Any, Any]], name: str) -> dict[str, Any]:
    for group in groups:
        found = {as_text(key): value for key, value in group.items()}
        if as_text(found.get("name", "")) == name:
            return found
    return {}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
