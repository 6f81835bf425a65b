"""mega: schedules, a durable job queue and a CPU worker pool for FastAPI services.

    from mega import Schedule, Job, Event, Listener, Worker       # what you declare
    from mega import Scheduler, JobQueue, JobWorker, WorkerPool   # what runs them
    from mega import outbox, emit                                  # events, in a transaction or now
    from mega.web import create_web_app, UserDep, ok              # the web side (mega.web)

Every public name is listed once, in `_EXPORTS` below, with the module that defines it. Names
load on first use, so a host (or a CPU pool's child process) imports only what it needs. No
public name is also the name of a submodule of `mega`, so `from mega import X` gives the same
object whatever was imported before (tests/mega/test_public_api.py checks both).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it: the one table of the public API.
_EXPORTS = {
    # configuration, context, errors, signals
    "Config": "mega.config",
    "load_config": "mega.config",
    "Bus": "mega.drivers.base",
    "LaneStats": "mega.drivers.base",
    "CacheAdapter": "mega.context",
    "RedisClient": "mega.drivers.redis.client",
    "Context": "mega.context",
    "Database": "mega.database",
    "EarlyClaim": "mega.context",
    "FencedLease": "mega.context",
    "LockAdapter": "mega.context",
    "TaskPool": "mega.context",
    "ConfigError": "mega.errors",
    "DependencyUnavailable": "mega.errors",
    "JobError": "mega.errors",
    "JobFailed": "mega.errors",
    "JobTimeout": "mega.errors",
    "Permanent": "mega.errors",
    "EventError": "mega.errors",
    "LockBackendError": "mega.errors",
    "MegaError": "mega.errors",
    "RegistrationError": "mega.errors",
    "TaskFailed": "mega.errors",
    "WorkerError": "mega.errors",
    "WorkerOverloaded": "mega.errors",
    "Observer": "mega.signals",
    "Signals": "mega.signals",
    # schedules
    "Cron": "mega.schedules.cron",
    "RedLock": "mega.schedules.locks",
    "Schedule": "mega.schedules.schedule",
    "ScheduleEntry": "mega.schedules.dynamic",
    "Tick": "mega.schedules.schedule",
    "Scheduler": "mega.schedules.scheduler",
    # jobs
    "DlqRecord": "mega.lanes.dlq",
    "Job": "mega.jobs.job",
    "JobContext": "mega.jobs.progress",
    "JobWorker": "mega.jobs.jobworker",
    "JobId": "mega.jobs.spec",
    "JobStatus": "mega.lanes.status",
    "AttemptRecord": "mega.lanes.status",
    "Cause": "mega.lanes.status",
    "WorkerSeen": "mega.lanes.presence",
    "JobQueue": "mega.jobs.queue",
    "chain": "mega.jobs.workflow",
    "group": "mega.jobs.workflow",
    "Outcome": "mega.jobs.steps",
    "WorkflowId": "mega.jobs.steps",
    "WorkflowStatus": "mega.jobs.steps",
    "WorkflowStep": "mega.jobs.steps",
    # what every run goes through (the config's `middlewares`)
    "CallNext": "mega.lanes.middleware",
    "Middleware": "mega.lanes.middleware",
    "Run": "mega.lanes.middleware",
    # events
    "EventBus": "mega.events.bus",
    "emit": "mega.events.bus",
    "Event": "mega.events.event",
    "ReceivedEvent": "mega.events.event",
    "Listener": "mega.events.listener",
    "Outbox": "mega.transactional.store",
    "OutboxStats": "mega.transactional.store",
    "outbox": "mega.transactional.store",
    "OutboxRelay": "mega.transactional.relay",
    "ListenerWorker": "mega.events.worker",
    # CPU workers
    "progress": "mega.workers.task_progress",
    "WorkerPool": "mega.workers.pool",
    "Worker": "mega.workers.worker",
    # hosts
    "asgi_app": "mega.runtime.asgi",
    "boot": "mega.runtime.boot",
    "shutdown": "mega.runtime.boot",
    "observe_jobs": "mega.runtime.metrics",
    "observe_listeners": "mega.runtime.metrics",
    "observe_relay": "mega.runtime.metrics",
    "observe_pool": "mega.runtime.metrics",
    "observe_scheduler": "mega.runtime.metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mega' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # the same table for type checkers (tests/mega/test_public_api.py compares)
    from mega.config import Config as Config
    from mega.config import load_config as load_config
    from mega.context import CacheAdapter as CacheAdapter
    from mega.context import Context as Context
    from mega.context import EarlyClaim as EarlyClaim
    from mega.context import FencedLease as FencedLease
    from mega.context import LockAdapter as LockAdapter
    from mega.context import TaskPool as TaskPool
    from mega.database import Database as Database
    from mega.drivers.base import Bus as Bus
    from mega.drivers.base import LaneStats as LaneStats
    from mega.drivers.redis.client import RedisClient as RedisClient
    from mega.errors import ConfigError as ConfigError
    from mega.errors import DependencyUnavailable as DependencyUnavailable
    from mega.errors import EventError as EventError
    from mega.errors import JobError as JobError
    from mega.errors import JobFailed as JobFailed
    from mega.errors import JobTimeout as JobTimeout
    from mega.errors import LockBackendError as LockBackendError
    from mega.errors import MegaError as MegaError
    from mega.errors import Permanent as Permanent
    from mega.errors import RegistrationError as RegistrationError
    from mega.errors import TaskFailed as TaskFailed
    from mega.errors import WorkerError as WorkerError
    from mega.errors import WorkerOverloaded as WorkerOverloaded
    from mega.events.bus import EventBus as EventBus
    from mega.events.bus import emit as emit
    from mega.events.event import Event as Event
    from mega.events.event import ReceivedEvent as ReceivedEvent
    from mega.events.listener import Listener as Listener
    from mega.events.worker import ListenerWorker as ListenerWorker
    from mega.jobs.job import Job as Job
    from mega.jobs.jobworker import JobWorker as JobWorker
    from mega.jobs.progress import JobContext as JobContext
    from mega.jobs.queue import JobQueue as JobQueue
    from mega.jobs.spec import JobId as JobId
    from mega.jobs.steps import Outcome as Outcome
    from mega.jobs.steps import WorkflowId as WorkflowId
    from mega.jobs.steps import WorkflowStatus as WorkflowStatus
    from mega.jobs.steps import WorkflowStep as WorkflowStep
    from mega.jobs.workflow import chain as chain
    from mega.jobs.workflow import group as group
    from mega.lanes.dlq import DlqRecord as DlqRecord
    from mega.lanes.middleware import CallNext as CallNext
    from mega.lanes.middleware import Middleware as Middleware
    from mega.lanes.middleware import Run as Run
    from mega.lanes.presence import WorkerSeen as WorkerSeen
    from mega.lanes.status import AttemptRecord as AttemptRecord
    from mega.lanes.status import Cause as Cause
    from mega.lanes.status import JobStatus as JobStatus
    from mega.runtime.asgi import asgi_app as asgi_app
    from mega.runtime.boot import boot as boot
    from mega.runtime.boot import shutdown as shutdown
    from mega.runtime.metrics import observe_jobs as observe_jobs
    from mega.runtime.metrics import observe_listeners as observe_listeners
    from mega.runtime.metrics import observe_pool as observe_pool
    from mega.runtime.metrics import observe_relay as observe_relay
    from mega.runtime.metrics import observe_scheduler as observe_scheduler
    from mega.schedules.cron import Cron as Cron
    from mega.schedules.dynamic import ScheduleEntry as ScheduleEntry
    from mega.schedules.locks import RedLock as RedLock
    from mega.schedules.schedule import Schedule as Schedule
    from mega.schedules.schedule import Tick as Tick
    from mega.schedules.scheduler import Scheduler as Scheduler
    from mega.signals import Observer as Observer
    from mega.signals import Signals as Signals
    from mega.transactional.relay import OutboxRelay as OutboxRelay
    from mega.transactional.store import Outbox as Outbox
    from mega.transactional.store import OutboxStats as OutboxStats
    from mega.transactional.store import outbox as outbox
    from mega.workers.pool import WorkerPool as WorkerPool
    from mega.workers.task_progress import progress as progress
    from mega.workers.worker import Worker as Worker
