"""One lane consumed in one process on Redis Streams: reading, claiming, promoting, retrying,
dead-lettering, and the finished entries' acks sent in batches.

An entry is acknowledged (XACK, then XDEL) only after its run: a worker that dies mid-job
leaves it pending in the group, and a live worker claims it (XAUTOCLAIM) once it has been idle
for the lane's ack wait. A running job renews its claim (`extend`: XCLAIM to itself). Attempts
come from the group's delivery count, plus the attempts of earlier entries of the same job
(`base`): a retry is moved to the sorted set with its attempt number and comes back as a new
entry when due, so it holds no slot while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from mega.drivers.base import Delivery, DlqRecord, DriverUnavailable, Lane, trace_headers
from mega.drivers.redis.client import OUTAGES, RedisClient, queue_script
from mega.drivers.redis.lanes import (
    Fields,
    as_text,
    ensure_groups,
    event_name,
    int_or_none,
    lane_keys,
    read_entries,
    text_or_none,
    turn_order,
)
from mega.drivers.redis.scripts import (
    BLOCK_MS,
    BURY,
    DLQ_MAXLEN,
    FAIR_FEED,
    HOUSEKEEPING_S,
    PROMOTE,
    PROMOTE_BATCH,
    RETRY,
)
from mega.tasks import wait_event

logger = logging.getLogger("mega.drivers.redis")

# A fetch that finds only entries its group's pattern does not match reads on, for this long.
MAX_FETCH_S = 0.5
# After a Redis error, a fetch waits this long before it returns [] (the loop calls again).
OUTAGE_PAUSE_S = 0.25


@dataclass(frozen=True)
class Entry:
    """A delivery's `handle`: the stream entry, and its fields for a retry's copy."""

    stream: str
    entry_id: bytes
    fields: Fields
    deliveries: int  # the group's delivery count of the entry


class RedisReceiver:
    """`Receiver` of one lane on Redis (see mega.drivers.base). Settling calls swallow Redis
    errors: the entry stays pending and is reclaimed after the ack wait (at-least-once)."""

    def __init__(self, redis: RedisClient, lane: Lane, consumer: str) -> None:
        self.redis = redis
        self.lane = lane
        self.keys = lane_keys(lane)
        self.consumer = consumer
        self.ack_wait_ms = max(1, int(lane.ack_wait_s * 1000))
        self._promote = redis.register_script(PROMOTE)
        self._retry = redis.register_script(RETRY)
        self._bury = redis.register_script(BURY)
        self._feed = redis.register_script(FAIR_FEED) if lane.turns else None
        self._housekeeping_at = 0.0
        self._woken = asyncio.Event()
        self._warned = ""  # the last outage said by fetch (said once, until a read works)
        self._settle_warned = False
        # Finished entries waiting for their XACK (+ XDEL), sent in batches by one task: one
        # round trip for many jobs, what lets a worker keep up with a bare XREADGROUP loop.
        self._acks: dict[str, list[bytes]] = {}
        self._acks_waiting = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False

    # -- fetch --------------------------------------------------------------------------------

    async def fetch(self, limit: int) -> list[Delivery]:
        if self._take_wake():
            return []
        if limit <= 0:
            await self._pause(0.005)
            return []
        found: list[Delivery] = []
        try:
            now = time.monotonic()
            if now >= self._housekeeping_at:
                self._housekeeping_at = now + HOUSEKEEPING_S
                found += await self._housekeeping(limit)
            deadline = now + MAX_FETCH_S
            while len(found) < limit:
                # what housekeeping found goes now, without waiting for more
                answer: Any = await self._read(limit - len(found), block=not found)
                entries = list(read_entries(answer))
                found += self._deliver(self.keys.stream, entries)
                if found or not entries or self._woken.is_set() or time.monotonic() > deadline:
                    break  # else: only entries of other patterns (acked), so read on
            self._warned = ""
        except OUTAGES as exc:
            if str(exc) != self._warned:
                logger.warning("%s: Redis unavailable (%s); retrying", self.lane.name, exc)
                self._warned = str(exc)
            if not found:
                with contextlib.suppress(*OUTAGES):
                    await ensure_groups(self.redis, self.keys)  # a Redis restarted empty
                await self._pause(OUTAGE_PAUSE_S)
        if self._take_wake() and found:
            await self._hand_back(found)
            return []
        return found

    async def _read(self, count: int, *, block: bool) -> Any:
        """Up to `count` entries of the stream not yet delivered to the group, waiting up to
        BLOCK_MS for one when `block`. A fair (or prioritized) lane's next jobs are fed into
        the stream first, in the same round trip (scripts.FAIR_FEED)."""
        keys = self.keys
        if self._feed is None:
            return await self.redis.xreadgroup(
                keys.group,
                self.consumer,
                {keys.stream: ">"},
                count=count,
                block=BLOCK_MS if block else None,
            )
        async with self.redis.pipeline(transaction=False) as pipe:
            await queue_script(
                pipe,
                self._feed,
                [keys.fair_turns, keys.stream, keys.fair_count],
                [count, keys.fair_prefix, keys.group, turn_order(self.lane)],
            )
            pipe.xreadgroup(
                keys.group,
                self.consumer,
                {keys.stream: ">"},
                count=count,
                block=BLOCK_MS if block else None,
            )
            _, answer = await pipe.execute()
        return answer

    async def _hand_back(self, deliveries: list[Delivery]) -> None:
        """Stopping: what was just read goes back at once, for any worker to reclaim, its
        delivery count put back as it was (it never ran: not an attempt)."""
        for delivery in deliveries:
            entry = _entry(delivery)
            await self._settle(
                "hand back",
                self.redis.xclaim(
                    entry.stream,
                    self.keys.group,
                    self.consumer,
                    0,
                    [entry.entry_id],
                    idle=self.ack_wait_ms,
                    retrycount=entry.deliveries - 1,
                    justid=True,
                ),
            )

    def wake(self) -> None:
        """Make a waiting fetch return: at once when it pauses, after its current XREADGROUP
        (at most BLOCK_MS) when it reads. Once: the fetch after it waits as usual."""
        self._woken.set()

    def _take_wake(self) -> bool:
        woken = self._woken.is_set()
        self._woken.clear()
        return woken

    async def _pause(self, seconds: float) -> None:
        await wait_event(self._woken, seconds)

    async def _housekeeping(self, limit: int) -> list[Delivery]:
        """Promote due retries, claim entries whose worker died, read the lane's own stream
        when it has one of its own."""
        keys = self.keys
        await self._promote(
            keys=[keys.own, keys.scheduled], args=[int(time.time() * 1000), PROMOTE_BATCH]
        )
        found: list[Delivery] = []
        for stream in keys.streams:
            if len(found) < limit:
                found += await self._reclaim(stream, limit - len(found))
        if keys.own != keys.stream and len(found) < limit:
            answer: Any = await self.redis.xreadgroup(
                keys.group, self.consumer, {keys.own: ">"}, count=limit - len(found)
            )
            found += self._deliver(keys.own, list(read_entries(answer)))
        return found

    async def _reclaim(self, stream: str, limit: int) -> list[Delivery]:
        """Claim entries idle for the ack wait (their worker died, or they were released)."""
        answer: Any = await self.redis.xautoclaim(
            stream, self.keys.group, self.consumer, self.ack_wait_ms, "0-0", count=limit
        )
        claimed = [(entry_id, fields) for entry_id, fields in answer[1] if fields]
        if not claimed:  # an entry deleted meanwhile comes back empty (Redis 6.2)
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry_id, _ in claimed:
                pipe.xpending_range(stream, self.keys.group, min=entry_id, max=entry_id, count=1)
            details: list[Any] = await pipe.execute()
        deliveries = {
            found[0]["message_id"]: int(found[0]["times_delivered"]) for found in details if found
        }
        return self._deliver(stream, claimed, deliveries)

    def _deliver(
        self, stream: str, entries: list[tuple[Any, Any]], claimed: dict[Any, int] | None = None
    ) -> list[Delivery]:
        """Deliveries of the entries read: first deliveries, or with `claimed` the delivery
        counts of reclaimed ones. Entries of the shared log that the group's pattern does not
        match are acknowledged untouched."""
        accepts = self.keys.accepts if stream == self.keys.stream else None
        found: list[Delivery] = []
        for entry_id, raw in entries:
            fields: Fields = {as_text(name): value for name, value in raw.items()}
            if accepts is not None and not accepts(event_name(fields)):
                self._queue_ack(stream, entry_id)
                continue
            deliveries = 1 if claimed is None else claimed.get(entry_id, 2)
            found.append(
                Delivery(
                    id=as_text(fields.get("id", b"")),
                    subject=event_name(fields) if self.lane.kind == "group" else self.lane.subject,
                    body=bytes(fields.get("body", b"")),
                    attempt=int(fields.get("base") or 0) + deliveries,
                    enqueued_at_ms=int_or_none(fields.get("enqueued_at")),
                    run_at_ms=int_or_none(fields.get("run_at")),
                    key=(stream, as_text(entry_id)),
                    handle=Entry(stream, entry_id, fields, deliveries),
                    trace=trace_headers(fields.get("trace")),
                    flow_key=text_or_none(fields.get("flow_key")),
                )
            )
        return found

    # -- settling -----------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        entry = _entry(delivery)
        self._queue_ack(entry.stream, entry.entry_id)

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        """Ack (and delete) the entry and put a copy in the sorted set, due at `due_ms` with
        `base` = attempts: the copy's first delivery is attempt `attempts + 1`."""
        entry, keys = _entry(delivery), self.keys
        again = {name: as_text(value) for name, value in entry.fields.items()}
        again.update(run_at=str(due_ms), base=str(attempts))
        if delivery.trace:
            again["trace"] = json.dumps(delivery.trace)
        member = [item for pair in again.items() for item in pair]
        delete = int(keys.deletes(entry.stream))
        args: list[bytes | str | int] = [
            entry.entry_id,
            due_ms,
            json.dumps(member),
            keys.group,
            delete,
        ]
        await self._settle("retry", self._retry(keys=[entry.stream, keys.scheduled], args=args))

    async def extend(self, delivery: Delivery) -> None:
        """Renew the claim (XCLAIM to itself resets the entry's idle time)."""
        entry = _entry(delivery)
        await self._settle(
            "extend",
            self.redis.xclaim(
                entry.stream, self.keys.group, self.consumer, 0, [entry.entry_id], justid=True
            ),
        )

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        """The entry stays pending in the group (Redis has no "nack"): its idle time is set so
        that the reclaim of any worker takes it `delay_s` from now (at most the ack wait). If
        that call fails, it is claimed after the ack wait all the same."""
        entry = _entry(delivery)
        idle_ms = max(0, self.ack_wait_ms - int(delay_s * 1000))
        await self._settle(
            "release",
            self.redis.xclaim(
                entry.stream,
                self.keys.group,
                self.consumer,
                0,
                [entry.entry_id],
                idle=idle_ms,
                justid=True,
            ),
        )

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        """Record, ack and delete in one script (`terminate` changes nothing on Redis)."""
        entry, keys = _entry(delivery), self.keys
        stored = {name: value for name, value in record.items() if name != "seq"}
        try:
            await self._bury(
                keys=[entry.stream, keys.dlq, keys.dlq_index],
                args=[
                    entry.entry_id,
                    json.dumps(stored),
                    DLQ_MAXLEN,
                    keys.group,
                    int(keys.deletes(entry.stream)),
                    record["id"],
                ],
            )
        except OUTAGES as exc:
            raise DriverUnavailable(f"{self.lane.name}: dead letter not stored: {exc}") from exc

    async def close(self) -> None:
        """Send the acks still buffered. The client is the bus's: left open."""
        self._closing = True
        if self._flusher is not None:
            # Woken to see `_closing`, not cancelled: a cancelled flusher was seen not to end.
            self._acks_waiting.set()
            with contextlib.suppress(Exception):
                await self._flusher
            self._flusher = None
        await self._flush_quietly()

    async def _settle(self, what: str, call: Awaitable[Any]) -> None:
        try:
            await call
        except OUTAGES as exc:  # the entry is reclaimed after its ack wait
            level = logging.DEBUG if self._settle_warned else logging.WARNING
            self._settle_warned = True
            logger.log(
                level,
                "%s: %s not sent (%s); the entry comes back after its ack wait",
                self.lane.name,
                what,
                exc,
            )

    # -- batched acks -------------------------------------------------------------------------

    def _queue_ack(self, stream: str, entry_id: bytes) -> None:
        self._acks.setdefault(stream, []).append(entry_id)
        if self._closing:
            return  # close() sends it
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_forever(), name="mega-redis-acks")
        self._acks_waiting.set()

    async def _flush_forever(self) -> None:
        while not self._closing:
            await self._acks_waiting.wait()
            self._acks_waiting.clear()
            await self._flush_quietly()

    async def _flush_quietly(self) -> None:
        try:
            await self._flush()
        except OUTAGES as exc:  # unacked: reclaimed and run again later
            logger.warning(
                "%s: acks not sent (%s); those entries may run again", self.lane.name, exc
            )

    async def _flush(self) -> None:
        batches, self._acks = self._acks, {}
        if not batches:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, entry_ids in batches.items():
                pipe.xack(stream, self.keys.group, *entry_ids)
                if self.keys.deletes(stream):
                    pipe.xdel(stream, *entry_ids)
            await pipe.execute()


def _entry(delivery: Delivery) -> Entry:
    entry = delivery.handle
    if not isinstance(entry, Entry):
        raise TypeError(f"not a delivery of the redis driver: {delivery!r}")
    return entry
