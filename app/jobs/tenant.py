"""TenantJob: the noisy-neighbour demo's job, one per tenant's unit of work.

A run takes WORK_S and records, in Redis, how long it waited from its enqueue to its start,
under its run of the demo and its tenant (its key, `ctx.key`). Three classes, one per way the
demo runs a flood:

    TenantJob         in order: first in, first out
    FairTenantJob     fair = True: the tenants' jobs take turns
    LimitedTenantJob  fair, and at most LIMIT_PER_S starts a second across every worker

See app/services/noisy.py for the flood and what the page reads back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from app.replicas import REPLICAS
from mega import Job, JobContext

WORK_S = 0.02  # a run's pretend work
LIMIT_PER_S = 20  # LimitedTenantJob's starts a second
KEEP_S = 3600  # how long a demo run's figures are kept


def waits_key(run: str, tenant: str) -> str:
    """The list of one tenant's waits (ms) in one demo run."""
    return f"demo:noisy:{run}:wait:{tenant}"


def starts_key(run: str) -> str:
    """The list of the start times (epoch ms) of one demo run's jobs."""
    return f"demo:noisy:{run}:starts"


class TenantJob(Job):
    subject = "demo.tenant"
    bus = "jobs"
    concurrency = 4  # across all worker processes on NATS
    retries = 0
    replicas = REPLICAS
    keep_status_s = 0  # a flood of 500 keeps no status records

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
        started_ms = int(time.time() * 1000)
        run, tenant = payload["run"], ctx.key or "none"
        async with ctx.cache("main").native.pipeline(transaction=False) as pipe:
            pipe.rpush(waits_key(run, tenant), started_ms - int(payload["at"]))
            pipe.rpush(starts_key(run), started_ms)
            pipe.expire(waits_key(run, tenant), KEEP_S)
            pipe.expire(starts_key(run), KEEP_S)
            await pipe.execute()
        await asyncio.sleep(WORK_S)


class FairTenantJob(TenantJob):
    subject = "demo.fair_tenant"
    fair = True


class LimitedTenantJob(FairTenantJob):
    subject = "demo.limited_tenant"
    rate_limit = {"limit": LIMIT_PER_S, "period_s": 1}
