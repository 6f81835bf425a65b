"""Rate limits: a cap on how many runs of a Job (or a Listener group) start, across every worker.

    class CallPartner(Job):
        subject = "partner.call"
        bus = "jobs"
        rate_limit = {"limit": 20, "period_s": 1}      # 20 starts a second, whole fleet
        # rate_limit = {"limit": 5, "period_s": 1, "per": "key"}: 5 a second for each key
        # flow_cache = "main"                          # when the config has several caches

Every worker of the job shares one log of the starts it granted: a sorted set in a cache
(Redis), scored by Redis's own clock, trimmed to the last `period_s`; with "per": "key", one
log for each key the jobs were enqueued with (`enqueue(..., key=...)`; jobs without a key share
one). A consume loop fetches no more than `limit` deliveries, asks the log for a start for
each, starts those it is granted, and stamps their grants with the time they began; the others
go back to the queue as delayed messages, due when the window frees a start (a period later
for each `limit` of them), their attempt unchanged: a job held back spends no attempt and holds
no slot meanwhile. For a limit of the whole group, the loop then waits for the window before
it fetches again; a limit per key holds back that key's jobs only. So in any window of
`period_s` at most `limit` runs start (of each key), whichever workers run them.
mega/lanes/flow.py applies it, beside `key_concurrency`.

When the cache does not answer, the loop starts nothing and asks again a second later: a limit
protects someone else's service, so it fails closed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from mega.context import Context
from mega.errors import ConfigError

logger = logging.getLogger("mega.jobqueue")

# The longest a loop waits before it asks again (it also asks again after a refused cache).
MAX_WAIT_S = 1.0

# KEYS[1]: the log (a sorted set: grant -> when, in Redis's microseconds); ARGV: limit, period
# in µs, the starts wanted. Returns {granted members, µs until the oldest leaves the window}.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, period, wanted = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
local n = math.min(limit - redis.call('ZCARD', KEYS[1]), wanted)
local granted = {}
if n > 0 then
  local last = redis.call('INCRBY', KEYS[1] .. ':n', n)
  for i = 1, n do
    local member = tostring(last - n + i)
    redis.call('ZADD', KEYS[1], now, member)
    granted[i] = member
  end
  redis.call('PEXPIRE', KEYS[1], math.ceil(period / 1000) + 1000)
  redis.call('PEXPIRE', KEYS[1] .. ':n', math.ceil(period / 1000) + 1000)
end
local wait = 0
if n < wanted then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if oldest[2] then wait = tonumber(oldest[2]) + period - now end
end
return {granted, wait}
"""

# KEYS[1]: the log; ARGV[1]: how many of the members that follow started; the rest are given
# back. A started one is stamped with the time it started (XX: a grant the window has dropped
# meanwhile is not brought back).
SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local started = tonumber(ARGV[1])
for i = 2, #ARGV do
  if i - 1 <= started then
    redis.call('ZADD', KEYS[1], 'XX', now, ARGV[i])
  else
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return 1
"""


class RateLimit(BaseModel):
    """A Job's or a Listener's `rate_limit`: at most `limit` starts in any `period_s`, across
    the whole group, or with `per` "key" for each key (a Job's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limit: StrictInt = Field(ge=1)
    period_s: StrictFloat | StrictInt = Field(gt=0, le=86400)
    per: Literal["key"] | None = None


def flow_cache(ctx: Context, name: str, alias: str | None) -> Any:
    """The Redis client of the cache a lane's limits count in: `alias` (the class's
    `flow_cache`), or the config's only cache. ConfigError naming the fix when there is no
    such cache, raised when the worker starts rather than at the first fetch."""
    if alias is None:
        if len(ctx.caches) != 1:
            declared = ", ".join(sorted(ctx.caches)) or "none"
            raise ConfigError(
                f"{name}: rate_limit and key_concurrency count in a cache; the config declares "
                f'{declared}: name one with flow_cache = "<alias>"'
            )
        alias = next(iter(ctx.caches))
    elif alias not in ctx.caches:
        raise ConfigError(f"{name}: flow_cache names cache {alias!r}, which the config lacks")
    return ctx.cache(alias).native


@dataclass
class Grant:
    """Starts a loop may make now (`members` of the log, one each), or none and how long to
    wait before asking again."""

    members: list[str]
    wait_s: float


class RateLimiter:
    """One lane's share of a rate limit, in one process (see the module's docstring)."""

    def __init__(self, redis: Any, key: str, limit: RateLimit) -> None:
        self.key = key
        self.limit = limit
        self.per_key = limit.per == "key"
        self._take = redis.register_script(TAKE)
        self._settle = redis.register_script(SETTLE)

    def log_of(self, flow_key: str | None) -> str:
        """The log of a key's starts (of the whole group's, when the limit is not per key)."""
        return f"{self.key}:key:{flow_key or ''}" if self.per_key else self.key

    def due_s(self, place: int, wait_s: float) -> float:
        """When the `place`-th job held back now may start: once the window frees a start, a
        period later for each `limit` before it (so they come back no faster than they may
        start)."""
        return wait_s + (place // self.limit.limit) * self.limit.period_s

    async def take(self, wanted: int, flow_key: str | None = None) -> Grant:
        """Up to `wanted` starts (at most the limit's), of `flow_key`'s log when the limit is
        per key. A cache that does not answer grants none, for MAX_WAIT_S (logged)."""
        wanted = min(wanted, self.limit.limit)
        period_us = round(self.limit.period_s * 1_000_000)
        try:
            members, wait_us = await self._take(
                keys=[self.log_of(flow_key)], args=[self.limit.limit, period_us, wanted]
            )
        except Exception as exc:  # the cache is down or refuses: start nothing for now
            logger.warning("%s: its rate limit cannot be read (%s): nothing starts", self.key, exc)
            return Grant([], MAX_WAIT_S)
        granted = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
        return Grant(granted, min(MAX_WAIT_S, max(0.0, int(wait_us) / 1_000_000)))

    async def settle(self, grant: Grant, started: int, flow_key: str | None = None) -> None:
        """The first `started` of the grant's starts were made now (their grants are stamped
        with this time); give the others back."""
        if not grant.members:
            return
        try:
            await self._settle(keys=[self.log_of(flow_key)], args=[started, *grant.members])
        except Exception as exc:  # the grants expire with the window: nothing is lost
            logger.warning("%s: its rate limit was not settled (%s)", self.key, exc)
