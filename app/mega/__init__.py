"""mega: schedules, a durable job queue and a CPU worker pool for FastAPI services.

    from app.mega import Schedule, Job, Worker        # what you declare
    from app.mega import Scheduler, JobQueue, JobWorker, WorkerPool   # what runs them
"""

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
from app.mega.schedule import Schedule, Tick
from app.mega.scheduler import Scheduler
from app.mega.worker import Worker, WorkerPool

__all__ = [
    "BusAdapter",
    "CacheAdapter",
    "Config",
    "ConfigError",
    "Context",
    "Cron",
    "DependencyUnavailable",
    "JobError",
    "MegaError",
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
