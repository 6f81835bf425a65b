"""The Scheduler runs registered Schedule classes at their cron instants, once per instant across
a cluster of scheduler processes.

Why a per-tick claim: a lock taken once and released in `finally` lets a fast run release
before a slower peer (clocks up to a second apart) even tries, and the tick runs twice. So each
planned instant is claimed under its own key, ``<prefix>:tick:<utc epoch seconds>``, and the
claim is left to expire. A separate overlap guard, ``<prefix>:running``, is released in
`finally` and keeps a long run from overlapping the next tick anywhere in the cluster: the
winner renews it every third of its TTL while the run lives, so a run may outlast the TTL (and
the period) and still hold it, while a winner that dies stops renewing and blocks the next
ticks for one TTL at most. The
winner gets a fencing number from ``<prefix>:fence`` (INCR, at least the planned instant in epoch
ms, so it keeps rising after a Redis restarted empty) with the guard, and its run gets it
in `self.tick.fence`, so its writes can refuse a stale holder. Claim, guard and fence are one
call, `LockAdapter.acquire_fenced`: one Lua script (one round trip) on a single Redis, three
steps on a quorum (see `mega.schedules.locks`).

Whose clock: each instance wakes by its own, but the claim is judged by the lock server's. A claim
the server finds early (this clock is ahead of its) takes nothing and says how long until the
instant there; the tick waits that long and claims again, so a fast clock cannot run a tick
before its instant, and a slow one arrives after it and claims in time. The offset between the
clocks comes with every claim: sent as a `clock` signal (the metrics' gauge), and logged once
per lock when it exceeds `CLOCK_OFFSET_WARN_MS`.

Redis keys, with ``<prefix>`` = ``lock["key"]`` or ``mega:schedule:{<ClassName>}`` (on a Redis
Cluster the prefix needs a hash tag, ``{...}``, so that one script finds a tick's keys in one slot):
    <prefix>:tick:<epoch>   claim of one planned instant (left to expire)
    <prefix>:running        overlap guard (renewed while the run lives, then released)
    <prefix>:fence          fencing counter (no TTL)
    <prefix>:audit          last `audit_size` tick records of every instance (JSON list)
    <prefix>:paused         the pause record, read before each claim (see `mega.schedules.pause`)
    <prefix>:entries        the dynamic entries, JSON by key (see `mega.schedules.dynamic`)
    <prefix>:entries:changed  a new random token at each add, change or remove, read each second
    <prefix>:entry:<key>:tick:<epoch>, <prefix>:entry:<key>:running   an entry's claims and guard

One clock: every cron ticking here (each class's own, each dynamic entry's) is a line in one
`Timetable`, and one loop sleeps until the first instant, fires every line due then and puts
each back at its next instant. The locked ticks due at once read their pause records in one
round trip per lock, and the audit records written meanwhile go to Redis in one round trip:
so a scheduler of 1,000 schedules keeps one timer and a few connections busy, not 1,000.

The parts: this module is the Scheduler's API to register, start, stop and run schedules;
`steering.py` its base class, what it steers for the fleet (pause, dynamic entries, the audit);
`clock.py` is the timetable loop, `ticks.py` one tick and its audit, `guard.py` the claim and
overlap guard of a locked tick.

Time: the next instant is computed from the planned one, so a slow run never drifts the
schedule; instants missed while the process was down (or stalled past `LATE_LIMIT_S`) are not
replayed. A lock backend error is a `skip` signal carrying the error, never a crash: the loop
keeps ticking and recovers when Redis returns. Schedules without a lock run on every instance.

Pause: `pause(name)` stops a schedule's planned ticks on every instance from its next tick (each
is skipped with the reason "paused") until `resume(name)`; both are in the audit. The pause
holds for the class's dynamic entries too.

Dynamic entries: `add(name, key=..., cron=..., args=...)` runs the class under that key on a
cron of its own, besides its own cron, until `remove(name, key=...)`. A started scheduler reads
the change tokens of the lock-holding classes every second (one round trip per lock) and keeps
one line per entry in its timetable, so the fleet follows a change within about a second; an
entry's ticks are claimed under its own keys.

Each run gets its own Schedule instance with `self.tick` (a `Tick`), and a shallow copy of the
context whose `extras["tick"]` is the same Tick, for code that only receives `ctx`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from mega import clock
from mega.context import Context
from mega.errors import RegistrationError
from mega.schedules import cron
from mega.schedules.audit import AUDIT_TIMEOUT_S, DEFAULT_AUDIT_SIZE
from mega.schedules.clock import Clock
from mega.schedules.dynamic import (
    ScheduleEntry,
    entry_spec,
)
from mega.schedules.schedule import (
    Schedule,
    ScheduleSpec,
    require_lock_tag,
    validate_schedule,
)
from mega.schedules.steering import ScheduleSteering
from mega.schedules.ticks import TickResult, Ticks
from mega.signals import Observer, Signals
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.scheduler")

SIGNALS = ("run", "skip", "done", "fail", "clock")
# After cancelling runs that outlived `stop()`, how long to let their `finally` release guards.
CANCEL_GRACE_S = 2.0
# How many next instants `describe()` lists.
PREVIEW_RUNS = 5


class Scheduler(ScheduleSteering):
    """Runs Schedule classes on their cron (its base class steers them: pause, dynamic
    entries, the audit; mega/schedules/steering.py). Signals: run, skip, done, fail, clock."""

    def __init__(
        self,
        ctx: Context,
        *,
        instance_id: str | None = None,
        stop_timeout_s: float = 30.0,
        audit_size: int = DEFAULT_AUDIT_SIZE,
    ) -> None:
        """A scheduler with no schedule yet: `register` them, then `start`.

        Args:
            ctx: the host's context: its locks guard the ticks and keep their audit, and each
                run gets a shallow copy of it.
            instance_id: this scheduler's name in the audit and in each Tick; None takes
                `ctx.instance_id`.
            stop_timeout_s: how long `stop()` waits for running runs by default, in seconds.
            audit_size: how many tick records are kept per schedule, all instances together.
        """
        self.ctx = ctx
        self.instance_id = instance_id or ctx.instance_id
        self.stop_timeout_s = stop_timeout_s
        self.audit_size = audit_size
        self.signals = Signals(SIGNALS)
        self._specs: dict[str, ScheduleSpec] = {}
        self.ticks = Ticks(ctx, self.instance_id, self.signals, audit_size)
        self.clock = Clock(ctx, self._specs, self.ticks)

    def on(self, name: str, observer: Observer) -> Callable[[], None]:
        """Subscribe to a signal (ValueError for an unknown name); returns an unsubscribe.

        Args:
            name: "run", "skip", "done", "fail" or "clock".
            observer: called with each signal as one dict, `{"signal": name, **fields}`; it
                may be async. One that raises is logged and skipped.
        """
        return self.signals.on(name, observer)

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def register(self, schedule: type[Schedule]) -> Scheduler:
        """Validate every setting now (RegistrationError names each bad field); chainable.

        Args:
            schedule: the Schedule subclass itself, whose `name` no registered schedule has
                yet. A started scheduler starts ticking it at once.
        """
        spec = validate_schedule(schedule, self.ctx.locks.keys())
        lock = spec.lock
        clustered = lock is not None and isinstance(self.ctx.lock(lock.alias).native, RedisCluster)
        require_lock_tag(spec, clustered)
        if spec.name in self._specs:
            raise RegistrationError(f"a schedule named {spec.name!r} is already registered")
        if spec.timezone is None:
            logger.warning(
                "schedule %r has no timezone: it follows the host's local time (%s); "
                "set `timezone` to an IANA name such as 'Europe/Berlin'",
                spec.name,
                spec.zone,
            )
        self._specs[spec.name] = spec
        self.ticks.add(spec.name)
        if self.clock.started:
            self.clock.add(spec)
        return self

    async def start(self) -> None:
        """Start ticking every registered schedule (idempotent): one clock loop for them all,
        and one reader of the dynamic entries per lock."""
        self.clock.start()

    async def stop(self, timeout_s: float | None = None) -> None:
        """No new ticks; wait up to `timeout_s` for running runs, then cancel what is left
        (their guards are still released).

        Args:
            timeout_s: seconds to wait for running runs; None waits `stop_timeout_s`.
        """
        await self.clock.stop()
        runs = set(self.clock.runs)
        if runs:
            limit = self.stop_timeout_s if timeout_s is None else timeout_s
            _, late = await asyncio.wait(runs, timeout=limit)
            if late:
                logger.warning("stop: cancelling %d run(s) still going after %ss", len(late), limit)
                await cancel_and_wait(late, CANCEL_GRACE_S)
        if self.ticks.background:
            await asyncio.wait(set(self.ticks.background), timeout=CANCEL_GRACE_S)

    async def run_now(self, name: str, extras: dict[str, Any] | None = None) -> TickResult:
        """Run one tick of `name` now, through the overlap guard and fence (no per-instant
        claim: a manual tick is its own instant). `ran` is False with the reason on a skip.
        A paused schedule runs too: the pause stops the planned ticks, and a manual tick is
        someone asking for this one. It returns once its audit record is on Redis too (within
        AUDIT_TIMEOUT_S): `recent_ticks` then shows it on every instance, as the caller who
        just ran it expects.

        Args:
            name: a registered schedule's name (ValueError otherwise).
            extras: added to this run's `ctx.extras`: what the caller of a manual tick asks of
                it, say how long to take. None adds nothing.
        """
        spec = self._spec(name)
        tick = self.ticks.tick(spec, clock.utcnow(), "manual", extras or {})
        result = await self.clock.track(tick)
        if self.ticks.background:  # the audit pushes (`Ticks.record`), this tick's among them
            await asyncio.wait(set(self.ticks.background), timeout=AUDIT_TIMEOUT_S)
        return result

    def describe(self, name: str) -> dict[str, Any]:
        """Settings and the next `PREVIEW_RUNS` instants (ISO-8601 with the zone's offset); none
        for a class with `cron = None` (entries only: `describe_entry` gives theirs).

        Args:
            name: a registered schedule's name (ValueError otherwise).
        """
        spec = self._spec(name)
        lock = None
        if spec.lock is not None:
            lock = {"lock": spec.lock.alias, "ttl": spec.lock.ttl_ms, "key": spec.lock.key_prefix}
        runs = [] if spec.cron is None else cron.next_runs(spec.cron, PREVIEW_RUNS, tz=spec.zone)
        return {
            "name": spec.name,
            "cron": spec.cron,
            "timezone": spec.timezone or f"host local time ({spec.zone})",
            "lock": lock,
            "next_runs": [instant.isoformat() for instant in runs],
        }

    def describe_entry(self, name: str, entry: ScheduleEntry) -> dict[str, Any]:
        """An entry of `name` as `describe` gives the class: its zone (the class's when it has
        none of its own) and next `PREVIEW_RUNS` instants, with its key, args and writer.

        Args:
            name: the registered schedule the entry belongs to (ValueError otherwise).
            entry: one of its entries, as `entries` or `add` gives it.
        """
        ticked = entry_spec(self._spec(name), entry)
        runs = cron.next_runs(entry.cron, PREVIEW_RUNS, tz=ticked.zone)
        return {
            "key": entry.key,
            "cron": entry.cron,
            "timezone": ticked.timezone or f"host local time ({ticked.zone})",
            "args": entry.args,
            "by": entry.by,
            "at_ms": entry.at_ms,
            "next_runs": [instant.isoformat() for instant in runs],
        }
