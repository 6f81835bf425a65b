"""The noisy-neighbour demo: tenant "big" floods the queue, tenant "small" adds a few jobs
after, and the page draws how long each tenant's jobs waited, in order against fair.

A run has an id; its jobs carry it and record their waits (app/jobs/tenant.py). `start` sends
the flood, `figures` reads what has run so far.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Literal

from app.jobs.tenant import (
    KEEP_S,
    FairTenantJob,
    LimitedTenantJob,
    TenantJob,
    starts_key,
    waits_key,
)
from mega import JobQueue

Mode = Literal["in_order", "fair", "limited"]
# The jobs each tenant enqueues, big's first: fewer under the rate limit, which starts
# LIMIT_PER_S a second.
TENANTS: dict[Mode, tuple[tuple[str, int], ...]] = {
    "in_order": (("big", 500), ("small", 5)),
    "fair": (("big", 500), ("small", 5)),
    "limited": (("big", 60), ("small", 5)),
}
JOBS: dict[Mode, type[TenantJob]] = {
    "in_order": TenantJob,
    "fair": FairTenantJob,
    "limited": LimitedTenantJob,
}


def meta_key(run: str) -> str:
    return f"demo:noisy:{run}"


async def start(queue: JobQueue, redis: Any, mode: Mode) -> str:
    """Enqueue big's flood, then small's few, all of one demo run; its id."""
    run = uuid.uuid4().hex[:12]
    await redis.set(meta_key(run), json.dumps({"mode": mode}), ex=KEEP_S)
    job = JOBS[mode]
    for tenant, count in TENANTS[mode]:
        at = int(time.time() * 1000)
        payloads = [{"run": run, "at": at} for _ in range(count)]
        await queue.enqueue_many(job, payloads, key=tenant)
    return run


async def figures(redis: Any, run: str) -> dict[str, Any] | None:
    """Each tenant's jobs done so far, of how many, and their waits' p50 and p99 (ms); the
    starts in each second since the first; None for an unknown run."""
    meta = await redis.get(meta_key(run))
    if meta is None:
        return None
    mode: Mode = json.loads(meta)["mode"]
    async with redis.pipeline(transaction=False) as pipe:
        for tenant, _ in TENANTS[mode]:
            pipe.lrange(waits_key(run, tenant), 0, -1)
        pipe.lrange(starts_key(run), 0, -1)
        *waits, starts = await pipe.execute()
    tenants = {}
    for (tenant, count), found in zip(TENANTS[mode], waits, strict=True):
        ms = sorted(int(value) for value in found)
        tenants[tenant] = {
            "enqueued": count,
            "done": len(ms),
            "wait_p50_ms": percentile(ms, 50),
            "wait_p99_ms": percentile(ms, 99),
        }
    started = sorted(int(value) for value in starts)
    per_second = [0] * (math.ceil((started[-1] - started[0] + 1) / 1000) if started else 0)
    for at in started:
        per_second[(at - started[0]) // 1000] += 1
    return {"run": run, "mode": mode, "tenants": tenants, "starts_per_s": per_second}


def percentile(ordered: list[int], p: float) -> int | None:
    """The nearest-rank percentile of sorted values (None when there are none)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]
