"""The `redis` driver of events: one log stream every listener group reads, for a team that runs
Redis but not NATS. The same Event and Listener classes as on NATS, the same signals, retries,
dead letters and DLQ tools (the job driver's `RedisConsumer` runs each group).

Keys, under `mega:events`:
    mega:events                    the log: every event, trimmed to `max_age_s` (XADD MINID);
                                   one consumer group `mega_group_<group>` per listener group,
                                   made at the log's start, so a new group replays what is kept
    mega:events:dedup:<id>         an event id seen within DEDUP_WINDOW_S (SET NX with a TTL)
    mega:events:group:<group>      the group's own stream: its retries and requeued records
    ...:scheduled, ...:dlq         the group's retries waiting for their time, its dead letters
    channel mega:outbox:wake       a commit with outbox rows, announced to relays elsewhere

Redis cannot filter a stream for a group: each group reads every event and acknowledges the
ones its pattern does not match without running them. An entry of the log is acknowledged by
each group and never deleted (the others may not have read it); the group's own entries are.
`concurrency` caps the runs of a group in each process, not across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from mega.context import Context
from mega.errors import DependencyUnavailable
from mega.events.bus import EventBus, RunEvent, fire_and_forget
from mega.events.event import SUBJECT_PREFIX, EventMessage, ReceivedEvent
from mega.events.listener import Listener, ListenerSpec, subject_matcher
from mega.jobs.queue import DEDUP_WINDOW_S, JobStats
from mega.jobs.redis_queue import Fields, Lane, RedisConsumer, RedisDeadLetters, as_text

logger = logging.getLogger("mega.events")

LOG_KEY = "mega:events"
WAKE_CHANNEL = "mega:outbox:wake"

# KEYS: log, dedup key; ARGV: id, subject, body, emitted at ms, oldest id kept (ms), dedup ttl s.
# Returns 0 when the id was a duplicate.
EMIT = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[6]) then return 0 end
redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[5], '*', 'id', ARGV[1], 'subject', ARGV[2],
           'body', ARGV[3], 'enqueued_at', ARGV[4], 'run_at', ARGV[4])
return 1
"""


def group_lane(spec: ListenerSpec) -> Lane:
    own = f"{LOG_KEY}:group:{spec.group}"
    return Lane(
        spec=spec, group=spec.durable, stream=LOG_KEY, own=own, scheduled=own + ":scheduled",
        dlq=own + ":dlq", record_subject=_subject, shared=True,
        accepts=_accepts(subject_matcher(spec.pattern)),
    )  # fmt: skip


class RedisEventBus(EventBus):
    """EventBus on a redis bus: see the module's docstring."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        native: Any = ctx.bus(bus_alias).native
        self.redis: Redis = native
        self.consumer = RedisConsumer(self.redis, self.instance_id, self.signal)
        self._emit = self.redis.register_script(EMIT)
        self._ensured: set[type[Listener]] = set()

    @property
    def dlq(self) -> RedisDeadLetters:
        return RedisDeadLetters(self.redis, self._lane)

    async def _lane(self, listener_cls: type[Any]) -> Lane:
        return group_lane(await self.ensure(listener_cls))

    @property
    def connected(self) -> bool:
        return True  # a Redis call finds out (and the relay retries after an error)

    async def ensure_stream(self) -> None:
        return None  # the log is made by its first XADD, or by a group's XGROUP CREATE

    async def ensure(self, listener_cls: type[Listener], *, force: bool = False) -> ListenerSpec:
        spec = self.spec(listener_cls)
        if listener_cls in self._ensured and not force:
            return spec
        try:
            await self.consumer.ensure(group_lane(spec))
        except (RedisError, OSError) as exc:
            message = f"{spec.group}: cannot set up its consumer group: {exc}"
            raise DependencyUnavailable("redis", message) from exc
        self._ensured.add(listener_cls)
        return spec

    async def publish(self, message: EventMessage) -> bool:
        try:
            [kept] = await self._publish([message])
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable("redis", f"cannot emit {message.subject}: {exc}") from exc
        event = message.subject.removeprefix(SUBJECT_PREFIX)
        await self.signal("emit", event=event, id=message.event_id, duplicate=not kept)
        return bool(kept)

    async def publish_many(self, messages: list[EventMessage]) -> None:
        await self._publish(messages)

    async def _publish(self, messages: list[EventMessage]) -> list[int]:
        oldest_kept = int((time.time() - self.max_age_s) * 1000) if self.max_age_s else 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for message in messages:
                await self._emit(
                    keys=[LOG_KEY, f"{LOG_KEY}:dedup:{message.event_id}"],
                    args=[
                        message.event_id, message.subject, message.body,
                        message.emitted_at_ms, oldest_kept, int(DEDUP_WINDOW_S),
                    ],
                    client=pipe,
                )  # fmt: skip
            answers: list[int] = await pipe.execute()
        return answers

    async def stats(self, listener_cls: type[Listener]) -> JobStats:
        """Pending counts every event the group has not read yet (its pattern's or not)."""
        lane = group_lane(await self.ensure(listener_cls))
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xinfo_groups(lane.stream)
                pipe.xlen(lane.own)
                pipe.xinfo_groups(lane.own)
                pipe.zcard(lane.scheduled)
                pipe.xlen(lane.dlq)
                log_groups, own_length, own_groups, scheduled, dead = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable("redis", f"cannot read {lane.spec.name}: {exc}") from exc
        log, own = _group(log_groups, lane.group), _group(own_groups, lane.group)
        in_flight = int(log.get("pending") or 0) + int(own.get("pending") or 0)
        unread = int(log.get("lag") or 0) + own_length - int(own.get("pending") or 0)
        return JobStats(pending=unread + scheduled, in_flight=in_flight, dlq=dead)

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
                except (RedisError, OSError):  # away: the relay polls meanwhile
                    await asyncio.sleep(1)

        task = asyncio.create_task(watch(), name="mega-outbox-watch")

        async def stop() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await task
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

        return stop

    def announce_commit(self) -> None:
        async def publish() -> None:
            with contextlib.suppress(RedisError, OSError):
                await self.redis.publish(WAKE_CHANNEL, b"")

        fire_and_forget(publish())

    async def _listen(self, spec: ListenerSpec, run_event: RunEvent) -> None:
        async def run(payload: Any, fields: Fields, attempt: int) -> None:
            await run_event(
                ReceivedEvent(
                    id=as_text(fields["id"]),
                    name=_subject(fields).removeprefix(SUBJECT_PREFIX),
                    data=payload,
                    emitted_at=int(fields["enqueued_at"]),
                    attempt=attempt,
                )
            )

        await self.consumer.run(group_lane(spec), run)

    async def _stop(self, timeout_s: float) -> None:
        await self.consumer.stop(timeout_s)


def _subject(fields: Fields) -> str:
    return as_text(fields["subject"])


def _accepts(matches: Callable[[str], bool]) -> Callable[[Fields], bool]:
    return lambda fields: matches(_subject(fields))


def _group(groups: list[dict[Any, Any]], name: str) -> dict[str, Any]:
    for group in groups:
        found = {as_text(key): value for key, value in group.items()}
        if as_text(found.get("name", "")) == name:
            return found
    return {}


EventBus.drivers["redis"] = RedisEventBus
