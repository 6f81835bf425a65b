"""mega: schedules, a durable job queue and a CPU worker pool for FastAPI services.

    from mega import Schedule, Job, Worker                        # what you declare
    from mega import Scheduler, JobQueue, JobWorker, WorkerPool   # what runs them

Names load on first use, so a host (or a CPU pool's child process) imports only what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it
_EXPORTS = {
    "Config": "mega.config",
    "load_config": "mega.config",
    "BusAdapter": "mega.context",
    "CacheAdapter": "mega.context",
    "Context": "mega.context",
    "boot": "mega.runtime.boot",
    "shutdown": "mega.runtime.boot",
    "Cron": "mega.schedules.cron",
    "ConfigError": "mega.errors",
    "DependencyUnavailable": "mega.errors",
    "JobError": "mega.errors",
    "MegaError": "mega.errors",
    "RegistrationError": "mega.errors",
    "WorkerError": "mega.errors",
    "RedLock": "mega.schedules.locks",
    "Schedule": "mega.schedules.schedule",
    "Tick": "mega.schedules.schedule",
    "Scheduler": "mega.schedules.scheduler",
    "Worker": "mega.workers.worker",
    "WorkerPool": "mega.workers.pool",
    "Job": "mega.jobs.job",
    "JobQueue": "mega.jobs.queue",
    "JobWorker": "mega.jobs.jobworker",
}

__all__ = [
    "BusAdapter",
    "CacheAdapter",
    "Config",
    "ConfigError",
    "Context",
    "Cron",
    "DependencyUnavailable",
    "Job",
    "JobError",
    "JobQueue",
    "JobWorker",
    "MegaError",
    "RedLock",
    "RegistrationError",
    "Schedule",
    "Scheduler",
    "Tick",
    "Worker",
    "WorkerError",
    "WorkerPool",
    "boot",
    "load_config",
    "shutdown",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mega' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from mega.config import Config, load_config
    from mega.context import BusAdapter, CacheAdapter, Context
    from mega.errors import (
        ConfigError,
        DependencyUnavailable,
        JobError,
        MegaError,
        RegistrationError,
        WorkerError,
    )
    from mega.jobs.job import Job
    from mega.jobs.jobworker import JobWorker
    from mega.jobs.queue import JobQueue
    from mega.runtime.boot import boot, shutdown
    from mega.schedules.cron import Cron
    from mega.schedules.locks import RedLock
    from mega.schedules.schedule import Schedule, Tick
    from mega.schedules.scheduler import Scheduler
    from mega.workers.pool import WorkerPool
    from mega.workers.worker import Worker
