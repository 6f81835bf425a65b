"""mega: schedules, a durable job queue and a CPU worker pool for FastAPI services.

    from mega import Schedule, Job, Event, Listener, Worker       # what you declare
    from mega import Scheduler, JobQueue, JobRunner, WorkerPool   # what runs them
    from mega import outbox                                        # events, in a transaction
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
    "RedisClient": "mega.drivers.redis.client",
    "Context": "mega.context",
    "Database": "mega.database",
    "JobFailed": "mega.errors",
    "JobTimeout": "mega.errors",
    "Permanent": "mega.errors",
    "MegaError": "mega.errors",
    "TaskFailed": "mega.errors",
    # schedules
    "Schedule": "mega.schedules.schedule",
    "ScheduleEntry": "mega.schedules.dynamic",
    "Tick": "mega.schedules.schedule",
    "Scheduler": "mega.schedules.scheduler",
    # jobs
    "DlqRecord": "mega.lanes.dlq",
    "Job": "mega.jobs.job",
    "JobContext": "mega.jobs.progress",
    "JobRunner": "mega.jobs.runner",
    "JobId": "mega.jobs.spec",
    "JobStatus": "mega.lanes.records",
    "AttemptRecord": "mega.lanes.records",
    "JobQueue": "mega.jobs.queue",
    "chain": "mega.jobs.workflow",
    "group": "mega.jobs.workflow",
    "WorkflowId": "mega.jobs.workflow_records",
    "WorkflowStatus": "mega.jobs.workflow_records",
    "WorkflowStep": "mega.jobs.workflow_records",
    # what every run goes through (the config's `middlewares`)
    "CallNext": "mega.lanes.middleware",
    "Middleware": "mega.lanes.middleware",
    "Run": "mega.lanes.middleware",
    # events
    "EventBus": "mega.events.bus",
    "Event": "mega.events.event",
    "ReceivedEvent": "mega.events.spec",
    "Listener": "mega.events.listener",
    "outbox": "mega.transactional.store",
    "ListenerRunner": "mega.events.runner",
    # CPU workers
    "progress": "mega.workers.task_progress",
    "WorkerPool": "mega.workers.pool",
    "Worker": "mega.workers.worker",
}


# Names that were public here before. Each still gives the same object, with a warning once
# (mega.deprecation), until the release CHANGELOG.md names. Moved: name -> (where to import it
# now, the module that defines it).
_MOVED = {
    # the errors a caller rarely names
    "ConfigError": ("mega.errors", "mega.errors"),
    "DependencyUnavailable": ("mega.errors", "mega.errors"),
    "EventError": ("mega.errors", "mega.errors"),
    "JobError": ("mega.errors", "mega.errors"),
    "LockBackendError": ("mega.errors", "mega.errors"),
    "RegistrationError": ("mega.errors", "mega.errors"),
    "WorkerError": ("mega.errors", "mega.errors"),
    "WorkerOverloaded": ("mega.errors", "mega.errors"),
    # the driver interface
    "Bus": ("mega.drivers", "mega.drivers.base"),
    "LaneStats": ("mega.drivers", "mega.drivers.base"),
    # what a host or a tool wires
    "CacheAdapter": ("mega.runtime", "mega.context"),
    "Cause": ("mega.runtime", "mega.lanes.records"),
    "Cron": ("mega.runtime", "mega.schedules.cron"),
    "EarlyClaim": ("mega.runtime", "mega.context"),
    "FencedLease": ("mega.runtime", "mega.context"),
    "LockAdapter": ("mega.runtime", "mega.context"),
    "Observer": ("mega.runtime", "mega.signals"),
    "Outbox": ("mega.runtime", "mega.transactional.store"),
    "OutboxRelay": ("mega.runtime", "mega.transactional.relay"),
    "OutboxStats": ("mega.runtime", "mega.transactional.store"),
    "Outcome": ("mega.runtime", "mega.jobs.workflow_records"),
    "RedLock": ("mega.runtime", "mega.schedules.locks"),
    "Signals": ("mega.runtime", "mega.signals"),
    "TaskPool": ("mega.runtime", "mega.context"),
    "WorkerSeen": ("mega.runtime", "mega.lanes.presence"),
    "asgi_app": ("mega.runtime", "mega.runtime.asgi"),
    "boot": ("mega.runtime", "mega.runtime.bootstrap"),
    "observe_jobs": ("mega.runtime", "mega.runtime.metrics"),
    "observe_listeners": ("mega.runtime", "mega.runtime.metrics"),
    "observe_pool": ("mega.runtime", "mega.runtime.metrics"),
    "observe_relay": ("mega.runtime", "mega.runtime.metrics"),
    "observe_scheduler": ("mega.runtime", "mega.runtime.metrics"),
    "shutdown": ("mega.runtime", "mega.runtime.bootstrap"),
}
# Replaced: name -> (the module that defines what it gives, its name there, what to write now).
_REPLACED = {
    "JobWorker": ("mega.jobs.runner", "JobRunner", "mega.JobRunner"),  # a Worker is a CPU pool
    "ListenerWorker": ("mega.events.runner", "ListenerRunner", "mega.ListenerRunner"),
    "emit": ("mega.events.bus", "emit", "await YourEvent.emit(ctx, payload)"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _MOVED or name in _REPLACED:
        from mega.deprecation import deprecated

        if name in _MOVED:
            home, module = _MOVED[name]
            defined_as, instead = name, f"from {home} import {name}"
        else:
            module, defined_as, instead = _REPLACED[name]
        deprecated(f"mega.{name}", instead)
        return getattr(importlib.import_module(module), defined_as)
    raise AttributeError(f"module 'mega' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # the same table for type checkers (tests/mega/test_public_api.py compares)
    from mega.config import Config as Config
    from mega.config import load_config as load_config
    from mega.context import Context as Context
    from mega.database import Database as Database
    from mega.drivers.redis.client import RedisClient as RedisClient
    from mega.errors import JobFailed as JobFailed
    from mega.errors import JobTimeout as JobTimeout
    from mega.errors import MegaError as MegaError
    from mega.errors import Permanent as Permanent
    from mega.errors import TaskFailed as TaskFailed
    from mega.events.bus import EventBus as EventBus
    from mega.events.event import Event as Event
    from mega.events.listener import Listener as Listener
    from mega.events.runner import ListenerRunner as ListenerRunner
    from mega.events.spec import ReceivedEvent as ReceivedEvent
    from mega.jobs.job import Job as Job
    from mega.jobs.progress import JobContext as JobContext
    from mega.jobs.queue import JobQueue as JobQueue
    from mega.jobs.runner import JobRunner as JobRunner
    from mega.jobs.spec import JobId as JobId
    from mega.jobs.workflow import chain as chain
    from mega.jobs.workflow import group as group
    from mega.jobs.workflow_records import WorkflowId as WorkflowId
    from mega.jobs.workflow_records import WorkflowStatus as WorkflowStatus
    from mega.jobs.workflow_records import WorkflowStep as WorkflowStep
    from mega.lanes.dlq import DlqRecord as DlqRecord
    from mega.lanes.middleware import CallNext as CallNext
    from mega.lanes.middleware import Middleware as Middleware
    from mega.lanes.middleware import Run as Run
    from mega.lanes.records import AttemptRecord as AttemptRecord
    from mega.lanes.records import JobStatus as JobStatus
    from mega.schedules.dynamic import ScheduleEntry as ScheduleEntry
    from mega.schedules.schedule import Schedule as Schedule
    from mega.schedules.schedule import Tick as Tick
    from mega.schedules.scheduler import Scheduler as Scheduler
    from mega.transactional.store import outbox as outbox
    from mega.workers.pool import WorkerPool as WorkerPool
    from mega.workers.task_progress import progress as progress
    from mega.workers.worker import Worker as Worker
