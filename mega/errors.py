"""One small error tree: every error a user can meet has a stable `code` and a message to act on."""

from __future__ import annotations


class MegaError(Exception):
    """Base of every error the framework raises on purpose."""

    code = "mega.error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        """An error with its message and its code.

        Args:
            message: what went wrong, and what to do about it.
            code: the stable code callers match on; None (the default) keeps the class's.
        """
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConfigError(MegaError):
    """The configuration is wrong; the message names the key."""

    code = "config.invalid"


class DependencyUnavailable(MegaError):
    """NATS, Redis or the database cannot be reached."""

    code = "dependency.unavailable"

    def __init__(self, dependency: str, message: str) -> None:
        """The error of a dependency that does not answer.

        Args:
            dependency: which one, kept as `dependency` ("nats", "redis", "postgres", ...).
            message: what could not be done, and why.
        """
        super().__init__(message)
        self.dependency = dependency


class DatabaseEncodingError(MegaError):
    """A PostgreSQL database not in UTF8; the message names its encoding and how to make one."""

    code = "database.encoding"


class RegistrationError(MegaError):
    """A Schedule, Job or Worker class is invalid; raised by `register()`, never at run time."""

    code = "registration.invalid"


class LockBackendError(MegaError):
    """A lock server failed (refused, timed out, errored); the message names it."""

    code = "lock.backend"


class WorkerError(MegaError):
    """A CPU worker pool failure. `code` is one of the `worker.*` codes of the classes below."""

    code = "worker.error"


class WorkerOverloaded(WorkerError):
    """The wait queue is full."""

    code = "worker.overloaded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        """The error of a pool that takes no more tasks for now.

        Args:
            message: how full the pool is, and when to try again.
            retry_after_s: when to try again, in whole seconds (>= 1), kept as
                `retry_after_s`; it suits a 429 Retry-After.
        """
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TaskFailed(WorkerError):
    """The task itself raised."""

    code = "worker.task_failed"

    def __init__(self, message: str, *, exc_type: str) -> None:
        """The error of a task that raised.

        Args:
            message: the task, its pool and what it raised.
            exc_type: the name of its exception class, kept as `exc_type`.
        """
        super().__init__(message)
        self.exc_type = exc_type


class JobError(MegaError):
    """A job queue failure (bad payload, unknown job, ...)."""


class JobFailed(JobError):
    """What `result()` raises for a job that ended without a result: dead-lettered or
    cancelled."""

    def __init__(self, message: str, *, code: str, status: object) -> None:
        """The error of one job that ended without a result.

        Args:
            message: the job, how it ended and, when dead-lettered, its last failure.
            code: `job.dead_lettered` or `job.cancelled`.
            status: its status record, kept as `status` (its `error` is the last failure of a
                dead-lettered job).
        """
        super().__init__(message, code=code)
        self.status = status

    code = "job.error"


class EventError(JobError):
    """An event or listener failure (bad payload, a group on another bus, ...). A JobError, so
    code that catches those catches these too: events travel the jobs' machinery."""

    code = "event.error"


class Permanent(Exception):
    """Raise it in a Job's or a Listener's `run` for a failure no retry can fix (a record that
    is gone, a payload the world refuses): the retries are skipped and the job goes to its DLQ
    after this one attempt. `permanent = (SomeError, ...)` on the class does the same for
    exceptions of those classes."""


class JobTimeout(Exception):
    """A run went past its class's `timeout_s`: it was cancelled, and the attempt counts as
    failed (retried by the class's policy)."""
