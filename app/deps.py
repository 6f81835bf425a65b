"""What the sample's routes need, as `Annotated` dependencies: the framework's (mega.web) bound
to the sample's aliases, and the objects create_app in app/web.py makes once per app."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from app.workers.pool_log import PoolLog
from mega import Database, EventBus, JobQueue, Scheduler, WorkerPool
from mega.web import context, pool_dep, provided, queue_dep

# The config's aliases: the bus of the jobs and events, the cache, the CPU pool (HashWorker).
BUS = "jobs"
CACHE = "main"
POOL = "hash"


def main_redis(request: Request) -> Any:
    """The redis.asyncio client of cache `main` (the demo's counters and lists)."""
    return context(request).cache(CACHE).native


def database(request: Request) -> Database:
    """The application's database (the signups, the outbox)."""
    return context(request).db


queue = queue_dep(BUS)
hash_pool = pool_dep(POOL)
scheduler = provided(Scheduler)
event_bus = provided(EventBus)
pool_log = provided(PoolLog)

RedisDep = Annotated[Any, Depends(main_redis)]
QueueDep = Annotated[JobQueue, Depends(queue)]
HashPoolDep = Annotated[WorkerPool, Depends(hash_pool)]
SchedulerDep = Annotated[Scheduler, Depends(scheduler)]
EventBusDep = Annotated[EventBus, Depends(event_bus)]
PoolLogDep = Annotated[PoolLog, Depends(pool_log)]
