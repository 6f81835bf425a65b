"""The CronCounter's state in Redis: a counter and a bounded history of runs.

The write is fenced: it only applies when the run's fencing number is higher than the last one
applied. A run that lost its lock (paused past the TTL, say) and wakes up late cannot overwrite
the work of a newer run. That is the fix the redlock critique asks for (Kleppmann, "How to do
distributed locking"): the lock alone is a best effort; the storage must check the fence.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mega import RedisClient


COUNT_KEY = "demo:cron:count"
HISTORY_KEY = "demo:cron:history"
FENCE_KEY = "demo:cron:last_fence"
# The page shows the newest runs; older ones are dropped so the list never grows without bound.
HISTORY_SIZE = 50
# The `ctx.extras` keys a manual tick's caller sets: keep the run going this many ms, and an
# asyncio.Event the run sets once it is counted, when the hold begins.
HOLD_EXTRA = "hold_ms"
HOLD_STARTED_EXTRA = "hold_started"
# Longest hold the page may ask for: two periods of the 30 s schedule, enough to span a tick.
MAX_HOLD_MS = 60_000
# What the page suggests: longer than the 30 s period, so the next tick surely falls inside it.
SUGGESTED_HOLD_MS = 35_000

# Apply the run only if its fence is newer than the last applied one (or it has none: no lock).
FENCED_RECORD = """
local fence = tonumber(ARGV[1])
if fence >= 0 then
  local last = tonumber(redis.call('GET', KEYS[3]) or '-1')
  if fence <= last then return 0 end
  redis.call('SET', KEYS[3], fence)
end
redis.call('INCR', KEYS[1])
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return 1
"""


async def record_run(redis: RedisClient, *, at: datetime, source: str, fence: int | None) -> bool:
    """Count one run; False when a newer fenced run already wrote (this one is stale)."""
    entry = json.dumps({"at": at.isoformat(), "source": source, "fence": fence})
    applied = await redis.eval(  # type: ignore[misc]
        FENCED_RECORD,
        3,
        COUNT_KEY,
        HISTORY_KEY,
        FENCE_KEY,
        -1 if fence is None else fence,
        entry,
        HISTORY_SIZE,
    )
    return bool(applied)


async def read_state(redis: RedisClient) -> dict[str, Any]:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(COUNT_KEY)
        pipe.lrange(HISTORY_KEY, 0, HISTORY_SIZE - 1)
        count, history = await pipe.execute()
    return {"count": int(count or 0), "history": [json.loads(item) for item in history]}
