"""mega: schedules, a durable job queue and a CPU worker pool for FastAPI services.

    from app.mega import Schedule, Job, Worker                        # what you declare
    from app.mega import Scheduler, JobQueue, JobWorker, WorkerPool   # what runs them

Names load on first use, so a host (or a CPU pool's child process) imports only what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it
_EXPORTS = {
    "Config": "app.mega.config",
    "load_config": "app.mega.config",
    "BusAdapter": "app.mega.context",
    "CacheAdapter": "app.mega.context",
    "Context": "app.mega.context",
    "boot": "app.mega.boot",
    "shutdown": "app.mega.boot",
    "Cron": "app.mega.cron",
    "ConfigError": "app.mega.errors",
    "DependencyUnavailable": "app.mega.errors",
    "JobError": "app.mega.errors",
    "MegaError": "app.mega.errors",
    "RegistrationError": "app.mega.errors",
    "WorkerError": "app.mega.errors",
    "RedLock": "app.mega.locks",
    "Schedule": "app.mega.schedule",
    "Tick": "app.mega.schedule",
    "Scheduler": "app.mega.scheduler",
    "Worker": "app.mega.worker",
    "WorkerPool": "app.mega.worker_pool",
    "Job": "app.mega.job",
    "JobQueue": "app.mega.jobqueue",
    "JobWorker": "app.mega.jobworker",
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
        raise AttributeError(f"module 'app.mega' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from app.mega.boot import boot, shutdown
    from app.mega.config import Config, load_config
    from app.mega.context import BusAdapter, CacheAdapter, Context
    from app.mega.cron import Cron
    from app.mega.errors import (
        ConfigError,
        DependencyUnavailable,
        JobError,
        MegaError,
        RegistrationError,
        WorkerError,
    )
    from app.mega.job import Job
    from app.mega.jobqueue import JobQueue
    from app.mega.jobworker import JobWorker
    from app.mega.locks import RedLock
    from app.mega.schedule import Schedule, Tick
    from app.mega.scheduler import Scheduler
    from app.mega.worker import Worker
    from app.mega.worker_pool import WorkerPool
