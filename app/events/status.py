"""What the /demo/events page shows of the listeners, kept in Redis by a hook on `mega worker`:

    demo:events:status:<event id>   hash: group -> queued | running | retrying | done | dlq
    demo:events:groups:<group>      hash: done, failed, dlq (counts since the demo started)

Attached in mega_config.py as `hooks = {"listeners": [attach_event_status]}`. Statuses expire
after a day, so a long-running demo never grows Redis without limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mega import Context, ListenerRunner

if TYPE_CHECKING:
    from mega import RedisClient

TTL_S = 24 * 3600
STATUS = {"start": "running", "retry": "retrying", "done": "done", "skip": "done", "dlq": "dlq"}
COUNTED = {"done": "done", "retry": "failed", "fail": "failed", "dlq": "dlq"}


def status_key(event_id: str) -> str:
    return f"demo:events:status:{event_id}"


def group_key(group: str) -> str:
    return f"demo:events:groups:{group}"


def attach_event_status(listeners: ListenerRunner, ctx: Context) -> None:
    redis = ctx.cache("main").native

    async def on_signal(signal: dict[str, Any]) -> None:
        kind, group, event_id = signal["signal"], signal["group"], signal["id"]
        async with redis.pipeline(transaction=False) as pipe:
            if kind in STATUS:
                pipe.hset(status_key(event_id), group, STATUS[kind])
                pipe.expire(status_key(event_id), TTL_S)
            if kind in COUNTED:
                pipe.hincrby(group_key(group), COUNTED[kind], 1)
            await pipe.execute()

    for name in ("start", "retry", "done", "skip", "fail", "dlq"):
        listeners.on(name, on_signal)


async def statuses(redis: RedisClient, event_ids: Iterable[str]) -> dict[str, dict[str, str]]:
    """Each event's status per listener group (groups not heard from yet are absent)."""
    ids = list(event_ids)
    async with redis.pipeline(transaction=False) as pipe:
        for event_id in ids:
            pipe.hgetall(status_key(event_id))
        found = await pipe.execute()
    return dict(zip(ids, found, strict=True))


async def group_counts(redis: RedisClient, group: str) -> dict[str, int]:
    counts = await redis.hgetall(group_key(group))
    return {name: int(counts.get(name, 0)) for name in ("done", "failed", "dlq")}
