"""The `redis` bus: jobs and events on Redis Streams, for a team that runs Redis but not NATS.

Each job subject is a stream read by one consumer group; the events are one log stream that
every listener group reads through a consumer group of its own (key names and scripts: see
mega/drivers/redis/scripts.py). Redis cannot filter a stream for a group: each group reads
every event and acknowledges the ones its pattern does not match without running them. An
entry of the log is acknowledged by each group and never deleted (the others may not have read
it); a lane's own entries are. `concurrency` caps the runs of a lane in each process, not across
processes. Dead letters are capped by count (DLQ_MAXLEN), not by the lane's age and size; a
page of them is one XREVRANGE with an exclusive end, and a hash indexes them by job id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Self, cast

from redis.asyncio.cluster import RedisCluster

from mega.config import BusSpec
from mega.constants import CLOSE_TASKS_S, CONNECT_TIMEOUT_S, REDIS_DURABLE_WAIT_S
from mega.drivers.base import (
    DEDUP_WINDOW_S,
    DlqRecord,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
    Table,
)
from mega.drivers.redis.client import (
    OUTAGES,
    NodePipeline,
    RedisClient,
    connect_redis,
    queue_script,
)
from mega.drivers.redis.lanes import (
    LaneKeys,
    as_text,
    entry_of,
    lane_keys,
    parse_record,
    turn_order,
)
from mega.drivers.redis.receiver import RedisReceiver, ensure_groups
from mega.drivers.redis.scripts import (
    DROP,
    EMIT,
    ENQUEUE,
    EVENT_SUBJECT_PREFIX,
    EVENTS_LOG,
    FAIR_PUSH,
    REQUEUE,
    WAKE_CHANNEL,
)
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.drivers.redis")


class RedisBus:
    """`Bus` on Redis (see mega.drivers.base). `native` is the `redis.asyncio.Redis` client, or
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

    # -- lanes --------------------------------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The lane's consumer group on its streams. Nothing else to set: Redis keeps no
        limits per stream (dead letters are capped by DLQ_MAXLEN whatever the lane says)."""
        try:
            await ensure_groups(self.redis, lane_keys(lane))
        except OUTAGES as exc:
            raise DriverUnavailable(f"{lane.name}: cannot set up its streams: {exc}") from exc

    # -- durable lanes: WAIT ------------------------------------------------------------------
    # Redis acknowledges a write before its replicas have it: a primary that dies in between
    # takes it along, and the replica promoted in its place never had it. WAIT n t blocks until
    # n replicas have every write made on the connection it is sent on (or t ms passed) and
    # answers how many do, so a durable lane's WAIT goes last on the pipeline of its writes,
    # one connection: on a Cluster, one to the master of the lane's slot (NodePipeline; every
    # key of a lane shares its hash tag). A write of the scheduler's promotion of a delayed job
    # is not waited for: the job it moves is on the replica already, in the sorted set.

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        """Delayed or deduplicated jobs through the ENQUEUE script, the others as plain XADDs
        (what a burst of enqueue_many was), all in one pipeline (`_write`)."""
        if lane.kind != "job":
            raise ValueError(f"publish() stores jobs; {lane.name} is a listener group")
        keys = lane_keys(lane)

        async def queue(pipe: Any) -> None:
            await self._queue_jobs(pipe, lane, keys, messages)

        answers = await self._write(lane, keys, queue, f"cannot enqueue on {lane.name}")
        return [answer != 0 for answer in answers]  # XADD answers an id, ENQUEUE 1 or 0

    async def _write(
        self, lane: Lane, keys: LaneKeys, queue: Callable[[Any], Awaitable[None]], failed: str
    ) -> list[Any]:
        """Send the writes `queue` puts on a pipeline, in one round trip; their answers. A
        durable lane's end with a WAIT (see above), checked here: on a Cluster, all on one
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
                _wait(lane, node_pipe)
                answers = await node_pipe.execute()
            else:
                async with self.redis.pipeline(transaction=False) as pipe:
                    await queue(pipe)
                    _wait(lane, pipe)
                    answers = await pipe.execute()
        except OUTAGES as exc:
            if pinned:  # a keyed call lets the client follow the slot to its new master
                with contextlib.suppress(*OUTAGES):
                    await self.redis.exists(keys.stream)
            raise DriverUnavailable(f"{failed}: {exc}") from exc
        if lane.durable:
            _confirm(lane, answers.pop())
        return answers

    async def _queue_jobs(
        self, pipe: Any, lane: Lane, keys: LaneKeys, messages: Sequence[Message]
    ) -> None:
        now_ms = int(time.time() * 1000)
        for message in messages:
            run_at = max(message.enqueued_at_ms, message.run_at_ms or 0)
            trace = json.dumps(message.trace) if message.trace else ""
            if lane.turns and run_at <= now_ms:
                await self._push_fair(pipe, lane, keys, message, run_at, trace)
                continue
            if not message.dedup and run_at <= now_ms:
                fields: list[Any] = ["id", message.id, "body", message.body,
                                     "enqueued_at", message.enqueued_at_ms, "run_at", run_at,
                                     "base", 0]  # fmt: skip
                if trace:
                    fields += ["trace", trace]
                if message.flow_key is not None:
                    fields += ["flow_key", message.flow_key]
                pipe.execute_command("XADD", keys.stream, "*", *fields)
                continue
            dedup = [keys.dedup(message.id)] if message.dedup else []
            await queue_script(
                pipe, self._enqueue, [keys.stream, keys.scheduled, *dedup],
                [
                    message.id, message.body, message.enqueued_at_ms, run_at,
                    run_at if run_at > now_ms else "", DEDUP_WINDOW_S, trace,
                    *(() if message.flow_key is None else (message.flow_key,)),
                ],
            )  # fmt: skip

    async def _push_fair(
        self, pipe: Any, lane: Lane, keys: LaneKeys, message: Message, run_at: int, trace: str
    ) -> None:
        """A due job of a fair lane into its key's list (of a prioritized lane: its band's;
        scripts.FAIR_PUSH); a delayed one waits in the sorted set as any other and joins the
        stream when due."""
        key = lane.turn_key(message) or ""
        fields = ["id", message.id, "body", message.body.decode(), "enqueued_at",
                  str(message.enqueued_at_ms), "run_at", str(run_at), "base", "0"]  # fmt: skip
        if trace:
            fields += ["trace", trace]
        if message.flow_key is not None:
            fields += ["flow_key", message.flow_key]
        dedup = [keys.dedup(message.id)] if message.dedup else []
        await queue_script(
            pipe, self._fair_push,
            [keys.fair_prefix + key, keys.fair_turns, keys.fair_count, keys.stream, *dedup],
            [key, json.dumps(fields), DEDUP_WINDOW_S, keys.fair_prefix, keys.group,
             turn_order(lane)],
        )  # fmt: skip

    async def stats(self, lane: Lane) -> LaneStats:
        """`stored` is XINFO STREAM's entries-added (a job's stream: every job, a delayed one
        or a retry counted again when it comes due; a group's: the events log, every event,
        plus its own stream's requeues and retries)."""
        keys = lane_keys(lane)
        try:
            if lane.kind == "job":
                return await self._job_stats(keys)
            return await self._group_stats(keys)
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read {lane.name}: {exc}") from exc

    async def _job_stats(self, keys: LaneKeys) -> LaneStats:
        """One pipeline. `oldest_ms`: the `enqueued_at` of the stream's first entry (settled
        entries are deleted, so it is the oldest waiting or running; a fair lane's jobs that
        wait for their key's turn are counted, not dated; the delayed ones wait in
        the sorted set, left out)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(keys.stream)
            pipe.xpending(keys.stream, keys.group)
            pipe.zcard(keys.scheduled)
            pipe.xlen(keys.dlq)
            pipe.xinfo_stream(keys.stream)
            pipe.xrange(keys.stream, count=1)
            pipe.get(keys.fair_count)
            length, pending, scheduled, dead, info, first, fair = await pipe.execute()
        in_flight = int(pending["pending"])
        return LaneStats(
            pending=length - in_flight + scheduled + int(fair or 0), in_flight=in_flight, dlq=dead,
            oldest_ms=_enqueued_at(first[0]) if first else None, stored=_added(info),
        )  # fmt: skip

    async def _group_stats(self, keys: LaneKeys) -> LaneStats:
        """Pending counts every event the group has not read yet (its pattern's or not). Two
        pipelines: `oldest_ms` is the oldest of the log's first entry the group holds (by its
        id's time: when Redis stored it), else its first unread one, and its own stream's
        first entry."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xinfo_groups(keys.stream)
            pipe.xlen(keys.own)
            pipe.xinfo_groups(keys.own)
            pipe.zcard(keys.scheduled)
            pipe.xlen(keys.dlq)
            pipe.xinfo_stream(keys.stream)
            pipe.xinfo_stream(keys.own)
            (
                log_groups,
                own_length,
                own_groups,
                scheduled,
                dead,
                log_info,
                own_info,
            ) = await pipe.execute()
        log, own = _group(log_groups, keys.group), _group(own_groups, keys.group)
        in_flight = int(log.get("pending") or 0) + int(own.get("pending") or 0)
        unread = int(log.get("lag") or 0) + own_length - int(own.get("pending") or 0)
        oldest: list[int] = []
        if in_flight or unread:
            last = as_text(log.get("last-delivered-id") or "0-0")
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xpending(keys.stream, keys.group)
                pipe.xrange(keys.stream, min="(" + last, count=1)
                pipe.xrange(keys.own, count=1)
                held, next_unread, own_first = await pipe.execute()
            if int(held["pending"]) and held.get("min"):
                oldest.append(_entry_ms(held["min"]))
            elif next_unread:
                oldest.append(_enqueued_at(next_unread[0]))
            if own_first:
                oldest.append(_enqueued_at(own_first[0]))
        return LaneStats(
            pending=unread + scheduled, in_flight=in_flight, dlq=dead,
            oldest_ms=min(oldest, default=None), stored=_added(log_info) + _added(own_info),
        )  # fmt: skip

    def receiver(self, lane: Lane, *, consumer: str) -> RedisReceiver:
        """A receiver with a consumer name of its own in the group (`consumer` + a random
        suffix): a restarted process never takes over its predecessor's pending entries but
        reclaims them after their ack wait, as any peer would."""
        return RedisReceiver(self.redis, lane, f"{consumer}:{uuid.uuid4().hex[:6]}")

    # -- dead letters -------------------------------------------------------------------------

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """XREVRANGE from the newest, or from the entry of `before` exclusive (`(<id>`): a
        range read of the stream, as fast on the last page as on the first."""
        top = "+" if before is None else "(" + entry_of(before)
        try:
            entries: Any = await self.redis.xrevrange(
                lane_keys(lane).dlq, max=top, min="-", count=limit
            )
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read the dead letters of {lane.name}: {exc}") from exc
        return [parse_record(entry_id, fields) for entry_id, fields in entries]

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """The entry the index (`<dlq>:ids`, written with each record) names, then that one
        entry. Dead letters stored before the index existed are indexed once, on the first
        look-up that finds no index at all."""
        keys = lane_keys(lane)
        try:
            entry_id = await self.redis.hget(keys.dlq_index, job_id)
            if entry_id is None and await self._index_unindexed(keys):
                entry_id = await self.redis.hget(keys.dlq_index, job_id)
            if entry_id is None:
                return None
            entries: Any = await self.redis.xrange(keys.dlq, min=entry_id, max=entry_id)
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read the dead letters of {lane.name}: {exc}") from exc
        return parse_record(*entries[0]) if entries else None

    async def _index_unindexed(self, keys: LaneKeys) -> bool:
        """Index every record when the stream has records and no index (records of before
        the index); False when there was nothing to do."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.exists(keys.dlq_index)
            pipe.xlen(keys.dlq)
            indexed, length = await pipe.execute()
        if indexed or not length:
            return False
        start = "-"
        while entries := cast(Any, await self.redis.xrange(keys.dlq, min=start, count=1000)):
            newest = {parse_record(e, f)["id"]: as_text(e) for e, f in entries}
            await self.redis.hset(keys.dlq_index, mapping=newest)  # type: ignore[arg-type]
            start = "(" + as_text(entries[-1][0])
        return True

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        keys = lane_keys(lane)
        entry_id = entry_of(seq)
        try:
            entries: Any = await self.redis.xrange(keys.dlq, min=entry_id, max=entry_id)
            if not entries:
                return False
            job_id = parse_record(*entries[0])["id"]
            deleted = await self._drop(keys=[keys.dlq, keys.dlq_index], args=[entry_id, job_id])
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot delete a dead letter of {lane.name}: {exc}") from exc
        return bool(deleted)

    async def count_dead(self, lane: Lane) -> int:
        try:
            return int(await self.redis.xlen(lane_keys(lane).dlq))
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot read the dead letters of {lane.name}: {exc}") from exc

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        """A new entry on the lane's own stream with `base` 0 (the attempt reset), and the
        record deleted. A record's `seq` is only the millisecond of its entry, so the entry is
        the one of that millisecond (or, without `seq`, the newest) with the record's job id.
        A record no longer there (requeued meanwhile) is requeued all the same. On a durable
        lane it returns once a replica has the new entry, as `publish` does."""
        keys = lane_keys(lane)
        now = int(time.time() * 1000)
        subject = str(record.get("subject") or lane.subject)
        fields: dict[Any, Any] = {
            "id": record["id"],
            "body": json.dumps(record["payload"], separators=(",", ":")),
            "enqueued_at": record.get("first_enqueued_at") or now,
            "run_at": now,
            "base": 0,  # a new entry with no earlier attempts: that is the attempt reset
            # A group's entry is matched and named by its subject (`events.<name>`).
            "subject": EVENT_SUBJECT_PREFIX + subject.removeprefix(EVENT_SUBJECT_PREFIX)
            if lane.kind == "group"
            else subject,
        }
        if "flow_key" in record:
            fields["flow_key"] = record["flow_key"]
        try:
            entry_id = await self._find_record(keys, record)
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot requeue on {lane.name}: {exc}") from exc
        entry = [part for pair in fields.items() for part in pair]

        async def queue(pipe: Any) -> None:
            if entry_id is None:
                pipe.execute_command("XADD", keys.own, "*", *entry)
            else:  # the new entry and the record's deletion in one step
                await queue_script(
                    pipe, self._requeue, [keys.dlq, keys.dlq_index, keys.own],
                    [as_text(entry_id), record["id"], *entry],
                )  # fmt: skip

        await self._write(lane, keys, queue, f"cannot requeue on {lane.name}")

    async def _find_record(self, keys: LaneKeys, record: DlqRecord) -> Any:
        """The record's entry: the one its `seq` names, else the newest of its id (index)."""
        seq = record.get("seq")
        entry_id: Any = entry_of(seq) if seq is not None else None
        if entry_id is None:
            entry_id = await self.redis.hget(keys.dlq_index, record["id"])
            if entry_id is None:
                return None
        entries: Any = await self.redis.xrange(keys.dlq, min=entry_id, max=entry_id)
        for found, raw in entries:
            if parse_record(found, raw)["id"] == record["id"]:
                return found
        return None

    async def purge(self, lane: Lane) -> int:
        key = lane_keys(lane).dlq
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xlen(key)
                pipe.delete(key, lane_keys(lane).dlq_index)
                count, _ = await pipe.execute()
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot purge the dead letters of {lane.name}: {exc}") from exc
        return int(count)

    # -- records ------------------------------------------------------------------------------

    async def put_records(
        self, lane: Lane, table: Table, records: Sequence[tuple[str, bytes]], *, create: bool,
        confirm: bool = True,
    ) -> list[bool]:  # fmt: skip
        """One SET per record with the lane's keep as its expiry (NX for a create: Redis
        answers nothing when the key exists), all in one pipeline, run in order. A table kept
        0 s is never written (nothing will be read)."""
        keep_ms = round(lane.keep_s(table) * 1000)
        if not records or keep_ms <= 0:
            return [True] * len(records)
        keys = lane_keys(lane)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, value in records:
                    pipe.set(keys.record(table, key), value, px=keep_ms, nx=create)
                if table == "workers":  # listed: see `list_records`
                    _index_records(pipe, keys, table, records, keep_ms)
                answers: list[Any] = await pipe.execute()
            answers = answers[: len(records)]
        except OUTAGES as exc:
            raise DriverUnavailable(
                f"cannot store the {table} records of {lane.name}: {exc}"
            ) from exc
        return [bool(answer) for answer in answers]

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        if not keys:
            return []
        names = lane_keys(lane)
        try:
            values = await self.redis.mget([names.record(table, key) for key in keys])
        except OUTAGES as exc:
            raise DriverUnavailable(
                f"cannot read the {table} records of {lane.name}: {exc}"
            ) from exc
        return cast(list[bytes | None], values)  # bytes: the client decodes no responses

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        """The keys of the table's index (a sorted set `<own>:<table>`, each key scored with
        its expiry, written with the "workers" records), the expired ones dropped on this
        read, then their values: two round trips. Only the "workers" table is indexed."""
        keys = lane_keys(lane)
        index = keys.record_index(table)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(index, "-inf", int(time.time() * 1000))
                pipe.zrange(index, 0, -1)
                _, names = await pipe.execute()
            if not names:
                return []
            found = [as_text(name) for name in names]
            values = cast(
                list[bytes | None],  # bytes: the client decodes no responses
                await self.redis.mget([keys.record(table, name) for name in found]),
            )
        except OUTAGES as exc:
            raise DriverUnavailable(
                f"cannot list the {table} records of {lane.name}: {exc}"
            ) from exc
        return [
            (name, value) for name, value in zip(found, values, strict=True) if value is not None
        ]

    # -- events -------------------------------------------------------------------------------

    async def ensure_events(self, *, max_age_s: float) -> None:
        return None  # the log is made by its first XADD, or by a group's XGROUP CREATE

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        """One EMIT per event (dedup key, XADD trimming what is older than `max_age_s`), in one
        pipeline. Every event is deduplicated by its id (ids not given are unique anyway)."""
        oldest_kept = int((time.time() - max_age_s) * 1000) if max_age_s else 0
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for message in messages:
                    await queue_script(
                        pipe, self._emit, [EVENTS_LOG, f"{EVENTS_LOG}:dedup:{message.id}"],
                        [
                            message.id, EVENT_SUBJECT_PREFIX + message.subject, message.body,
                            message.enqueued_at_ms, oldest_kept, DEDUP_WINDOW_S,
                            json.dumps(message.trace) if message.trace else "",
                        ],
                    )  # fmt: skip
                answers: list[Any] = await pipe.execute()
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot emit on {self.alias!r}: {exc}") from exc
        return [answer == 1 for answer in answers]

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        pubsub = self.redis.pubsub()

        async def watch() -> None:
            while True:
                try:
                    if not pubsub.subscribed:
                        await pubsub.subscribe(WAKE_CHANNEL)
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message is not None:
                        wake()
                except OUTAGES:  # away: the relay polls meanwhile
                    await asyncio.sleep(1)

        task = asyncio.create_task(watch(), name="mega-outbox-watch")

        async def stop() -> None:
            await cancel_and_wait([task], CLOSE_TASKS_S)
            with contextlib.suppress(*OUTAGES):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

        return stop

    def announce_commit(self) -> None:
        async def publish() -> None:
            with contextlib.suppress(*OUTAGES):
                await self.redis.publish(WAKE_CHANNEL, b"")

        task = asyncio.create_task(publish())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _wait(lane: Lane, pipe: Any) -> None:
    """A durable lane's writes end with a WAIT for one replica (see RedisBus._write)."""
    if lane.durable:
        pipe.execute_command("WAIT", 1, round(REDIS_DURABLE_WAIT_S * 1000))


def _confirm(lane: Lane, replicas: Any) -> None:
    """Raise unless WAIT says a replica has the lane's new jobs: they are on the primary, but
    a failover now would lose them, and the caller was not told they were stored."""
    if int(replicas) < 1:
        raise DriverUnavailable(
            f"{lane.name} is durable: its jobs were written to the Redis primary but no replica "
            f"confirmed them within {REDIS_DURABLE_WAIT_S:g} s, so they may be lost if the "
            "primary fails now. Is a replica attached and in sync (INFO replication)? Enqueue "
            "again with the same id to be sure: it is stored once"
        )


def _index_records(
    pipe: Any, keys: LaneKeys, table: Table, records: Sequence[tuple[str, bytes]], keep_ms: int
) -> None:
    """Add the keys to the table's index, scored with their expiry (epoch ms); the index
    itself lives as long as its latest record."""
    expires_ms = int(time.time() * 1000) + keep_ms
    index = keys.record_index(table)
    pipe.zadd(index, {key: expires_ms for key, _ in records})
    pipe.pexpire(index, keep_ms)


def _added(info: dict[Any, Any]) -> int:
    """Entries ever added to a stream (XINFO STREAM's entries-added, Redis 7+)."""
    found = {as_text(key): value for key, value in info.items()}
    return int(found.get("entries-added") or 0)


def _entry_ms(entry_id: Any) -> int:
    """When Redis stored an entry: its id's time part."""
    return int(as_text(entry_id).split("-")[0])


def _enqueued_at(entry: Any) -> int:
    """An entry's `enqueued_at` field, else its id's time."""
    entry_id, fields = entry
    value = fields.get(b"enqueued_at", fields.get("enqueued_at"))
    return int(value) if value is not None else _entry_ms(entry_id)


def _group(groups: list[dict[Any, Any]], name: str) -> dict[str, Any]:
    for group in groups:
        found = {as_text(key): value for key, value in group.items()}
        if as_text(found.get("name", "")) == name:
            return found
    return {}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
