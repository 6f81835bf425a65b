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

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from mega.drivers.base import (
    DEDUP_WINDOW_S,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
)
from mega.drivers.redis.client import (
    OUTAGES,
    queue_script,
)
from mega.drivers.redis.core import (
    added,
    enqueued_at,
    entry_ms,
    group_info,
)
from mega.drivers.redis.dead import RedisDeadLetters
from mega.drivers.redis.events import RedisEventLog
from mega.drivers.redis.lanes import (
    LaneKeys,
    as_text,
    ensure_groups,
    lane_keys,
    turn_order,
)
from mega.drivers.redis.receiver import RedisReceiver
from mega.drivers.redis.records import RedisRecordStore


class RedisBus(RedisDeadLetters, RedisRecordStore, RedisEventLog):
    """`Bus` on Redis (see mega.drivers.base): the lanes here; the connection in core.py, and
    the other concerns in dead.py, records.py and events.py."""

    # -- lanes --------------------------------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The lane's consumer group on its streams. Nothing else to set: Redis keeps no
        limits per stream (dead letters are capped by DLQ_MAXLEN whatever the lane says)."""
        try:
            await ensure_groups(self.redis, lane_keys(lane))
        except OUTAGES as exc:
            raise DriverUnavailable(f"{lane.name}: cannot set up its streams: {exc}") from exc

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        """Delayed or deduplicated jobs through the ENQUEUE script, the others as plain XADDs
        (what a burst of enqueue_many was), all in one pipeline (`write`)."""
        if lane.kind != "job":
            raise ValueError(f"publish() stores jobs; {lane.name} is a listener group")
        keys = lane_keys(lane)

        async def queue(pipe: Any) -> None:
            await self._queue_jobs(pipe, lane, keys, messages)

        answers = await self.write(lane, keys, queue, f"cannot enqueue on {lane.name}")
        return [answer != 0 for answer in answers]  # XADD answers an id, ENQUEUE 1 or 0

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
                fields: list[Any] = [
                    "id",
                    message.id,
                    "body",
                    message.body,
                    "enqueued_at",
                    message.enqueued_at_ms,
                    "run_at",
                    run_at,
                    "base",
                    0,
                ]
                if trace:
                    fields += ["trace", trace]
                if message.flow_key is not None:
                    fields += ["flow_key", message.flow_key]
                pipe.execute_command("XADD", keys.stream, "*", *fields)
                continue
            dedup = [keys.dedup(message.id)] if message.dedup else []
            await queue_script(
                pipe,
                self._enqueue,
                [keys.stream, keys.scheduled, *dedup],
                [
                    message.id,
                    message.body,
                    message.enqueued_at_ms,
                    run_at,
                    run_at if run_at > now_ms else "",
                    DEDUP_WINDOW_S,
                    trace,
                    *(() if message.flow_key is None else (message.flow_key,)),
                ],
            )

    async def _push_fair(
        self, pipe: Any, lane: Lane, keys: LaneKeys, message: Message, run_at: int, trace: str
    ) -> None:
        """A due job of a fair lane into its key's list (of a prioritized lane: its band's;
        scripts.FAIR_PUSH); a delayed one waits in the sorted set as any other and joins the
        stream when due."""
        key = lane.turn_key(message) or ""
        fields = [
            "id",
            message.id,
            "body",
            message.body.decode(),
            "enqueued_at",
            str(message.enqueued_at_ms),
            "run_at",
            str(run_at),
            "base",
            "0",
        ]
        if trace:
            fields += ["trace", trace]
        if message.flow_key is not None:
            fields += ["flow_key", message.flow_key]
        dedup = [keys.dedup(message.id)] if message.dedup else []
        await queue_script(
            pipe,
            self._fair_push,
            [keys.fair_prefix + key, keys.fair_turns, keys.fair_count, keys.stream, *dedup],
            [
                key,
                json.dumps(fields),
                DEDUP_WINDOW_S,
                keys.fair_prefix,
                keys.group,
                turn_order(lane),
            ],
        )

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
            pending=length - in_flight + scheduled + int(fair or 0),
            in_flight=in_flight,
            dlq=dead,
            oldest_ms=enqueued_at(first[0]) if first else None,
            stored=added(info),
        )

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
        log, own = group_info(log_groups, keys.group), group_info(own_groups, keys.group)
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
                oldest.append(entry_ms(held["min"]))
            elif next_unread:
                oldest.append(enqueued_at(next_unread[0]))
            if own_first:
                oldest.append(enqueued_at(own_first[0]))
        return LaneStats(
            pending=unread + scheduled,
            in_flight=in_flight,
            dlq=dead,
            oldest_ms=min(oldest, default=None),
            stored=added(log_info) + added(own_info),
        )

    def receiver(self, lane: Lane, *, consumer: str) -> RedisReceiver:
        """A receiver with a consumer name of its own in the group (`consumer` + a random
        suffix): a restarted process never takes over its predecessor's pending entries but
        reclaims them after their ack wait, as any peer would."""
        return RedisReceiver(self.redis, lane, f"{consumer}:{uuid.uuid4().hex[:6]}")
