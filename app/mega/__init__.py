"""mega: schedules, a durable job queue and a CPU worker pool for FastAPI services."""

from app.mega.config import Config, load_config
from app.mega.context import BusAdapter, CacheAdapter, Context
from app.mega.errors import (
    ConfigError,
    DependencyUnavailable,
    JobError,
    MegaError,
    RegistrationError,
    WorkerError,
)

__all__ = [
    "BusAdapter",
    "CacheAdapter",
    "Config",
    "ConfigError",
    "Context",
    "DependencyUnavailable",
    "JobError",
    "MegaError",
    "RegistrationError",
    "WorkerError",
    "load_config",
]
