"""The context every schedule run, job run and web handler receives.

`ctx.cache(alias)`, `ctx.lock(alias)`, `ctx.bus(alias)`, `ctx.db` and `ctx.workers[name]` are
looked up by the aliases the config declares. An unknown alias raises ConfigError naming it.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from mega.errors import ConfigError

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.js import JetStreamContext
    from redis.asyncio import Redis

    from mega.database import Database
    from mega.schedules.locks import LockAdapter
    from mega.workers.pool import WorkerPool


def new_instance_id(role: str) -> str:
    """`<role>@<host>:<pid>:<random>`: readable in audits, unique across restarts."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class CacheAdapter:
    """A Redis (or compatible) server. `native` is the redis.asyncio client."""

    alias: str
    url: str
    native: Redis


@dataclass
class BusAdapter:
    """A NATS connection that reconnects forever. `native` is the nats-py client."""

    alias: str
    url: str
    native: NatsClient

    @property
    def js(self) -> JetStreamContext:
        return self.native.jetstream()


@dataclass
class Context:
    """What the hosts build at boot (see `mega.runtime.boot`) and hand to every runtime."""

    instance_id: str
    caches: dict[str, CacheAdapter] = field(default_factory=dict)
    locks: dict[str, LockAdapter] = field(default_factory=dict)
    buses: dict[str, BusAdapter] = field(default_factory=dict)
    database: Database | None = None
    # Hosts without a web app open the database lazily, on first use of `ctx.db`.
    database_url: str | None = None
    workers: dict[str, WorkerPool] = field(default_factory=dict)
    # Free-form room for the application (the sample keeps its services here).
    extras: dict[str, Any] = field(default_factory=dict)

    def cache(self, alias: str) -> CacheAdapter:
        return _lookup(self.caches, alias, "services.caches")

    def lock(self, alias: str) -> LockAdapter:
        return _lookup(self.locks, alias, "services.locks")

    def bus(self, alias: str) -> BusAdapter:
        return _lookup(self.buses, alias, "services.buses")

    @property
    def db(self) -> Database:
        if self.database is None and self.database_url:
            from mega.database import Database  # SQLAlchemy: ~0.3 s, only when used

            self.database = Database(self.database_url)
        if self.database is None:
            raise ConfigError("services.database is not configured")
        return self.database


T = TypeVar("T")


def _lookup(table: dict[str, T], alias: str, key: str) -> T:
    try:
        return table[alias]
    except KeyError:
        declared = ", ".join(sorted(table)) or "none"
        raise ConfigError(f"{key}: no alias {alias!r} (declared: {declared})") from None
