"""The inbox: a listener group remembers the event ids it has completed and skips them.

JetStream drops a second publish of the same event id only within its duplicate window (two
minutes by default). An outbox relay that comes back later, or an event requeued by hand,
publishes again and every group would run it twice. A group with `inbox = "<cache alias>"`
keeps `mega:inbox:<group>:<event id>` in that Redis for `inbox_ttl_s` (longer than the events
stream keeps events) once `run` succeeded, and acknowledges a redelivered id without running it.

It narrows the window, not closes it: a worker that dies between the end of `run` and the
mark runs the event again. Effects that must be exactly-once still key on the event id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

KEY_PREFIX = "mega:inbox:"


class Inbox:
    """Completed event ids of one listener group, in Redis."""

    def __init__(self, redis: Redis, group: str, ttl_s: int) -> None:
        self.redis = redis
        self.prefix = f"{KEY_PREFIX}{group}:"
        self.ttl_s = ttl_s

    async def seen(self, event_id: str) -> bool:
        return bool(await self.redis.exists(self.prefix + event_id))

    async def mark(self, event_id: str) -> None:
        await self.redis.set(self.prefix + event_id, "1", ex=self.ttl_s)
