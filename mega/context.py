"""The context every schedule run, job run and web handler receives.

`ctx.cache(alias)`, `ctx.lock(alias)`, `ctx.bus(alias)`, `ctx.db` and `ctx.workers[name]` are
looked up by the aliases the config declares. An unknown alias raises ConfigError naming it.

The context sits below the abstractions, so it names what it hands out by interface: a lock is
any `LockAdapter` (`mega.schedules.locks.RedLock` is the driver), a CPU pool any `TaskPool`
(`mega.workers.pool.WorkerPool`). The hosts in `mega.runtime` fill it in at boot.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, overload

from mega.drivers.base import Bus
from mega.errors import ConfigError

if TYPE_CHECKING:
    from mega.database import Database
    from mega.drivers.redis.client import RedisClient

B = TypeVar("B", bound=Bus)
P = ParamSpec("P")
R = TypeVar("R")

# Why `acquire_fenced` held nothing: the claim was taken already, or the guard is held.
Refusal = Literal["claimed", "overlap"]


def new_instance_id(role: str) -> str:
    """`<role>@<host>:<pid>:<random>`: readable in audits, unique across restarts."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class FencedLease:
    """A lock held through `acquire_fenced`: `token` releases it, `fence` came with it."""

    token: str
    fence: int  # larger than every fencing number drawn before under the same fence key


@dataclass(frozen=True)
class EarlyClaim:
    """`acquire_fenced` found the claim's instant still ahead on the lock server's clock: it
    took nothing; try again in `wait_ms` milliseconds, when the server reaches the instant."""

    wait_ms: int


class LockAdapter(Protocol):
    """What `ctx.lock(alias)` gives: one-attempt locks with tokens (opaque strings)."""

    @property
    def native(self) -> RedisClient:
        """The first server's client, for side records such as the scheduler's audit."""
        ...

    async def acquire(self, key: str, ttl_ms: int) -> str | None:
        """One attempt, no waiting: a fresh token when acquired, else None.

        Args:
            key: the lock's key.
            ttl_ms: how long the lock is held, in ms, unless released or extended first.
        """
        ...

    async def release(self, key: str, token: str) -> bool:
        """Delete the lock only if it is still this holder's; True when it did.

        Args:
            key: the lock's key.
            token: what `acquire` returned.
        """
        ...

    async def extend(self, key: str, token: str, ttl_ms: int) -> bool:
        """Hold the lock longer if it is still this holder's; True when it did.

        Args:
            key: the lock's key.
            token: what `acquire` returned.
            ttl_ms: how long to hold it from now, in ms.
        """
        ...

    async def incr(self, key: str) -> int:
        """The next fencing number under a key: larger than every one handed out before.

        Args:
            key: the fencing counter's key.
        """
        ...

    async def acquire_fenced(
        self,
        key: str,
        ttl_ms: int,
        fence_key: str,
        *,
        claim_key: str | None = None,
        claim_ttl_ms: int = 0,
        fence_floor: int = 0,
        claim_at_ms: int = 0,
    ) -> FencedLease | Refusal | EarlyClaim:
        """One attempt, no waiting, at a claim, a lock and its fencing number together.

        With `claim_key`: an `EarlyClaim` while the lock server's clock is still before
        `claim_at_ms` by more than the adapter's tolerance (a few ms; nothing is taken), so no
        caller acts before an instant whatever its own clock says. Else "claimed" when that key
        is taken already; else it is taken for `claim_ttl_ms` and left to expire, even when
        "overlap" follows (the claim is a one-shot: whoever takes it consumes it). Then
        "overlap" when `key` is held; else `key` is held for `ttl_ms` and the lease carries its
        token (for `release(key, token)`) and the next fencing number under `fence_key`, at
        least `fence_floor`. A backend failure raises LockBackendError and does not leave `key`
        held (the claim may be).

        Args:
            key: the lock's key.
            ttl_ms: how long the lock is held, in ms (a positive int).
            fence_key: the key of the counter the fencing number is drawn from.
            claim_key: the one-shot claim's key; None (the default): no claim, only the lock.
            claim_ttl_ms: how long the claim is kept, in ms (a positive int with `claim_key`).
            fence_floor: the least fencing number to hand out. Give something that grows on its
                own (the scheduler gives the tick's planned instant in epoch ms), and fences
                keep increasing even when the counter is lost with a Redis restarted empty.
            claim_at_ms: the instant claimed, in epoch ms, with `claim_key`; 0 (the default)
                never waits.
        """
        ...

    @property
    def clock_offset_ms(self) -> float | None:
        """This process's clock minus the lock server's (ms; the median over a quorum's
        servers), measured at the last `acquire_fenced` from the middle of its round trip;
        None before the first."""
        ...


class TaskPool(Protocol):
    """What `ctx.workers[name]` gives: a running CPU pool (see `mega.workers`)."""

    name: str

    @overload
    async def run(
        self, task: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...
    @overload
    async def run(self, task: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    async def run(
        self,
        task: str,
        /,
        args: Any = None,
        timeout_ms: float | None = None,
        on_progress: Callable[[float, str | None], None] | None = None,
    ) -> Any: ...
    async def run(self, task: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run one task off the event loop and return its result (WorkerError on failure).

        Args:
            task: the task's function itself, typed as it is, or its name.
            *args: the function's positional arguments; with a name, what `**kwargs` names
                may come here instead, in that order.
            **kwargs: the function's keyword arguments; with a name, the task's one `args`, a
                `timeout_ms` and an `on_progress(fraction, note)` that receives what the task
                reports with `mega.progress`.
        """
        ...

    def kill_one(self) -> int | None:
        """SIGKILL one child (a busy one first), as a crash would; its pid, or None."""
        ...

    def stats(self) -> dict[str, Any]:
        """Size, busy and queued slots, restarts, and whether the pool is broken."""
        ...

    def on(self, name: str, observer: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
        """Observe a signal; returns an unsubscribe function.

        Args:
            name: the signal's name (`crash`, `replaced`, ...).
            observer: called with each such signal, a dict `{"signal": name, **fields}`.
        """
        ...

    async def stop(self, timeout_s: float = ...) -> None:
        """Refuse new runs, wait for in-flight ones, end the children.

        Args:
            timeout_s: how long to wait for the runs in flight, in seconds (default: the
                pool's own).
        """
        ...


@dataclass
class CacheAdapter:
    """A Redis (or compatible) server, or a Redis Cluster. `native` is the redis.asyncio client
    (`redis.asyncio.cluster.RedisCluster` for a `redis+cluster://` URL)."""

    alias: str
    url: str
    native: RedisClient


@dataclass
class Context:
    """What the hosts build at boot (see `mega.runtime.bootstrap`) and hand to every runtime."""

    instance_id: str
    caches: dict[str, CacheAdapter] = field(default_factory=dict)
    locks: dict[str, LockAdapter] = field(default_factory=dict)
    buses: dict[str, Bus] = field(default_factory=dict)  # each its driver's class
    database: Database | None = None
    # Hosts without a web app open the database lazily, on first use of `ctx.db`.
    database_url: str | None = None
    workers: dict[str, TaskPool] = field(default_factory=dict)
    # The config's `middlewares`: what every job's and listener's run goes through, the first
    # outermost, each `async (run, call_next)` (see mega.lanes.middleware).
    middlewares: list[Callable[..., Awaitable[Any]]] = field(default_factory=list)
    # Free-form room for the application (the sample keeps its services here).
    extras: dict[str, Any] = field(default_factory=dict)
    # What the layers above make once per context and keep here, by a key of their own (the
    # JobQueue behind `Job.enqueue`). A run's context shares its host's.
    memo: dict[object, Any] = field(default_factory=dict, repr=False)

    def cache(self, alias: str) -> CacheAdapter:
        """The cache of an alias.

        Args:
            alias: a cache alias of the config (`services.caches`); ConfigError naming it
                otherwise.
        """
        return _lookup(self.caches, alias, "services.caches")

    def lock(self, alias: str) -> LockAdapter:
        """The lock of an alias.

        Args:
            alias: a lock alias of the config (`services.locks`); ConfigError naming it
                otherwise.
        """
        return _lookup(self.locks, alias, "services.locks")

    @overload
    def bus(self, alias: str) -> Bus: ...
    @overload
    def bus(self, alias: str, driver: type[B]) -> B: ...

    def bus(self, alias: str, driver: type[Bus] | None = None) -> Bus:
        """The connected bus of an alias.

        Args:
            alias: a bus alias of the config (`services.buses`); ConfigError naming it
                otherwise.
            driver: a driver class such as `mega.drivers.nats.NatsBus`: the bus is checked to
                be that driver (ConfigError otherwise) and typed as it, so that its `native` is
                the engine's own client: `ctx.bus("jobs", NatsBus).native.jetstream()`. None
                (the default): any driver.
        """
        bus = _lookup(self.buses, alias, "services.buses")
        if driver is not None and not isinstance(bus, driver):
            raise ConfigError(f"services.buses.{alias}: a {bus.driver} bus, not {driver.driver}")
        return bus

    @property
    def has_database(self) -> bool:
        """Whether `ctx.db` gives a database (open already, or opened on first use)."""
        return self.database is not None or bool(self.database_url)

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
