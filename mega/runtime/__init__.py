"""mega.runtime: what a host or a tool wires around the classes you declare.

    from mega.runtime import boot, shutdown, asgi_app        # a context from a config, and back
    from mega.runtime import observe_jobs, observe_scheduler # Prometheus metrics of a runtime
    from mega.runtime import OutboxRelay, Signals, RedLock   # the relay, signals, the lock

The `mega worker`, `mega scheduler`, `mega web` and `mega work` commands use these; a service
that runs mega inside a process of its own does too. Names load on first use, as `mega`'s do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it.
_EXPORTS = {
    "CacheAdapter": "mega.context",
    "Cause": "mega.lanes.records",
    "Cron": "mega.schedules.cron",
    "EarlyClaim": "mega.context",
    "FencedLease": "mega.context",
    "LockAdapter": "mega.context",
    "Observer": "mega.signals",
    "Outbox": "mega.transactional.store",
    "OutboxRelay": "mega.transactional.relay",
    "OutboxStats": "mega.transactional.store",
    "Outcome": "mega.jobs.workflow_records",
    "RedLock": "mega.schedules.locks",
    "Signals": "mega.signals",
    "TaskPool": "mega.context",
    "WorkerSeen": "mega.lanes.presence",
    "asgi_app": "mega.runtime.asgi",
    "boot": "mega.runtime.bootstrap",
    "observe_jobs": "mega.runtime.metrics",
    "observe_listeners": "mega.runtime.metrics",
    "observe_pool": "mega.runtime.metrics",
    "observe_relay": "mega.runtime.metrics",
    "observe_scheduler": "mega.runtime.metrics",
    "shutdown": "mega.runtime.bootstrap",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mega.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # the same table for type checkers
    from mega.context import CacheAdapter as CacheAdapter
    from mega.context import EarlyClaim as EarlyClaim
    from mega.context import FencedLease as FencedLease
    from mega.context import LockAdapter as LockAdapter
    from mega.context import TaskPool as TaskPool
    from mega.jobs.workflow_records import Outcome as Outcome
    from mega.lanes.presence import WorkerSeen as WorkerSeen
    from mega.lanes.records import Cause as Cause
    from mega.runtime.asgi import asgi_app as asgi_app
    from mega.runtime.bootstrap import boot as boot
    from mega.runtime.bootstrap import shutdown as shutdown
    from mega.runtime.metrics import observe_jobs as observe_jobs
    from mega.runtime.metrics import observe_listeners as observe_listeners
    from mega.runtime.metrics import observe_pool as observe_pool
    from mega.runtime.metrics import observe_relay as observe_relay
    from mega.runtime.metrics import observe_scheduler as observe_scheduler
    from mega.schedules.cron import Cron as Cron
    from mega.schedules.locks import RedLock as RedLock
    from mega.signals import Observer as Observer
    from mega.signals import Signals as Signals
    from mega.transactional.relay import OutboxRelay as OutboxRelay
    from mega.transactional.store import Outbox as Outbox
    from mega.transactional.store import OutboxStats as OutboxStats
