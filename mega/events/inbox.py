"""The inbox in Redis: a listener group remembers the event ids it has completed and skips them.

JetStream drops a second publish of the same event id only within its duplicate window (two
minutes by default). An outbox relay that comes back later, or an event requeued by hand,
publishes again and every group would run it twice. A group with `inbox = "<cache alias>"`
keeps `mega:inbox:<group>:<event id>` in that Redis for `inbox_ttl_s` (longer than the events
stream keeps events) once `run` succeeded, and acknowledges a redelivered id without running it.

That narrows the window, it does not close it: a worker that dies between the end of `run` and
the mark runs the event again. An effect in that same Redis closes it with `apply`, which runs
the effect's commands and sets the mark in one Lua script:

    await event.inbox.apply(event.id, ("HINCRBY", "signups:domains", domain, 1))

Either the commands ran and the mark is set, or neither: a redelivery finds the mark and the
commands never run twice. (For database effects, see `inbox = "db"`: mega/events/db_inbox.py.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mega.drivers.redis.client import RedisClient

KEY_PREFIX = "mega:inbox:"

# One Redis command and its arguments, as `redis.call` takes them: ("HINCRBY", key, field, 1).
Command = tuple[str | bytes | int | float, ...]

# KEYS[1] the mark; ARGV[1] its TTL (s), then each command as its argument count and arguments.
APPLY_ONCE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local i = 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
return 1
"""


class Inbox:
    """Completed event ids of one listener group, in Redis."""

    def __init__(self, redis: RedisClient, group: str, ttl_s: int) -> None:
        self.redis = redis
        self.prefix = f"{KEY_PREFIX}{group}:"
        self.ttl_s = ttl_s
        self._apply_once = redis.register_script(APPLY_ONCE)

    async def seen(self, event_id: str) -> bool:
        return bool(await self.redis.exists(self.prefix + event_id))

    async def mark(self, event_id: str) -> None:
        await self.redis.set(self.prefix + event_id, "1", ex=self.ttl_s)

    async def apply(self, event_id: str, *commands: Command) -> bool:
        """Run `commands` in this Redis and mark `event_id` done, in one script, unless it is
        marked already: True when they ran, False when the id had been done (nothing ran).

        Keys are any of this Redis (a single server, not a Cluster). A command Redis refuses
        (a wrong type) raises ResponseError with no mark; the commands before it stay done,
        since Redis does not roll a script back: give several only when none can fail."""
        args: list[str | bytes | int | float] = [self.ttl_s]
        for command in commands:
            if not command:
                raise ValueError("an empty Redis command: give its name and arguments")
            args += [len(command), *command]
        return bool(await self._apply_once(keys=[self.prefix + event_id], args=args))
