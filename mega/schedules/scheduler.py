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

The parts: this module is the Scheduler's API; `clock.py` is the timetable loop, `ticks.py`
one tick and its audit, `guard.py` the claim and overlap guard of a locked tick.

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
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from mega import clock
from mega.context import Context
from mega.errors import DependencyUnavailable, RegistrationError
from mega.schedules import audit, cron
from mega.schedules.audit import AUDIT_TIMEOUT_S, DEFAULT_AUDIT_SIZE
from mega.schedules.clock import Clock
from mega.schedules.dynamic import (
    ScheduleEntry,
    entries_lock,
    entry_spec,
    read_entries,
    validate_entry,
    write_entry,
)
from mega.schedules.locks import REDIS_OUTAGES
from mega.schedules.pause import SchedulePause, lock_of, read_pause, write_pause
from mega.schedules.schedule import (
    LockPlan,
    Schedule,
    ScheduleSpec,
    require_lock_tag,
    validate_schedule,
)
from mega.schedules.ticks import TickResult, Ticks
from mega.signals import Observer, Signals
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.scheduler")

SIGNALS = ("run", "skip", "done", "fail", "clock")
# After cancelling runs that outlived `stop()`, how long to let their `finally` release guards.
CANCEL_GRACE_S = 2.0
# How many next instants `describe()` lists.
PREVIEW_RUNS = 5


class Scheduler:
    """Runs Schedule classes on their cron. Signals: run, skip, done, fail, clock."""

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

    async def pause(self, name: str, *, by: str = "") -> SchedulePause:
        """Pause `name` on every instance: from the next tick on, each scheduler skips its
        planned ticks with the reason "paused" (a run already going finishes; `run_now` still
        runs). The Scheduler need not be started. ConfigError `schedule.no_lock` for a
        schedule without a lock; DependencyUnavailable when its Redis does not answer.

        Args:
            name: a registered schedule's name (ValueError otherwise).
            by: who pauses it, kept in the pause record and named in the audit ("?" when empty).
        """
        return await self._set_pause(name, paused=True, by=by)

    async def resume(self, name: str, *, by: str = "") -> SchedulePause:
        """Undo `pause`: every instance runs `name`'s next planned tick again.

        Args:
            name: a registered schedule's name (ValueError otherwise).
            by: who resumes it, kept in the pause record and named in the audit ("?" when empty).
        """
        return await self._set_pause(name, paused=False, by=by)

    async def paused(self, name: str) -> SchedulePause:
        """Whether `name` is paused, since when and by whom; after a resume, `paused` is False
        with who resumed it and when. A schedule without a lock is never paused.

        Args:
            name: a registered schedule's name (ValueError otherwise).
        """
        spec = self._spec(name)
        if spec.lock is None:
            return SchedulePause(False)
        try:
            return await read_pause(self.ctx.lock(spec.lock.alias).native, spec.lock)
        except REDIS_OUTAGES as exc:
            raise _unreachable(spec.lock, f"cannot read whether {name} is paused", exc) from exc

    async def _set_pause(self, name: str, *, paused: bool, by: str) -> SchedulePause:
        spec = self._spec(name)
        plan = lock_of(spec)
        native = self.ctx.lock(plan.alias).native
        try:
            record = await write_pause(
                native,
                plan,
                paused=paused,
                by=by,
                instance=self.instance_id,
                audit_size=self.audit_size,
            )
        except REDIS_OUTAGES as exc:
            what = "pause" if paused else "resume"
            raise _unreachable(plan, f"cannot {what} {name}", exc) from exc
        logger.info("schedule %r %s by %s", name, "paused" if paused else "resumed", by or "?")
        return record

    async def add(
        self,
        name: str,
        *,
        key: str,
        cron: str,
        timezone: str | None = None,
        args: dict[str, Any] | None = None,
        by: str = "",
    ) -> ScheduleEntry:
        """Run `name` under `key` on a cron of its own, on every started scheduler within
        about a second, each instant once across them; besides the class's own cron. Adding a
        key that exists changes it (its loop restarts on the new cron). The Scheduler need not
        be started. ConfigError `schedule.entry_invalid` for a bad key, cron, zone or args
        (nothing is written), `schedule.no_lock` for a class without a lock;
        DependencyUnavailable when its Redis does not answer.

        Args:
            name: a registered schedule's name (ValueError otherwise).
            key: the entry's key, `self.key` in its runs: 1 to 128 letters, digits or . _ @ -,
                starting with a letter or digit.
            cron: the entry's cron expression, 5 or 6 fields (see `mega.schedules.cron`).
            timezone: the IANA zone `cron` is read in; None takes the class's zone.
            args: a JSON object, `self.args` in its runs; None gives {}.
            by: who adds it, for the audit.
        """
        spec = self._spec(name)
        plan = entries_lock(spec)
        entry = validate_entry(name, key, cron, timezone, args)
        entry = dataclasses.replace(entry, at_ms=clock.now_ms(), by=by)
        before = await self._write_entry(spec, plan, entry.key, entry, by, "add")
        word = "added" if before is None else "changed"
        logger.info(
            "schedule %r key %r %s by %s: %r in %s",
            name,
            key,
            word,
            by or "?",
            entry.cron,
            entry.timezone or spec.timezone,
        )
        return entry

    async def remove(self, name: str, *, key: str, by: str = "") -> ScheduleEntry | None:
        """Stop the entry `key` of `name` on every scheduler within about a second (a run
        already going finishes); the entry removed, or None when there was none (nothing is
        written then). Errors as `add`.

        Args:
            name: a registered schedule's name (ValueError otherwise).
            key: the key the entry was added under.
            by: who removes it, for the audit.
        """
        spec = self._spec(name)
        plan = entries_lock(spec)
        before = await self._write_entry(spec, plan, key, None, by, "remove")
        if before is not None:
            logger.info("schedule %r key %r removed by %s", name, key, by or "?")
        return before

    async def entries(self, name: str) -> list[ScheduleEntry]:
        """The dynamic entries of `name`, by key; none for a class without a lock.

        Args:
            name: a registered schedule's name (ValueError otherwise).
        """
        spec = self._spec(name)
        if spec.lock is None:
            return []
        try:
            stored = await read_entries(self.ctx.lock(spec.lock.alias).native, spec.lock)
        except REDIS_OUTAGES as exc:
            raise _unreachable(spec.lock, f"cannot read the entries of {name}", exc) from exc
        return list(stored.values())

    async def _write_entry(
        self,
        spec: ScheduleSpec,
        plan: LockPlan,
        key: str,
        entry: ScheduleEntry | None,
        by: str,
        what: str,
    ) -> ScheduleEntry | None:
        native = self.ctx.lock(plan.alias).native
        try:
            return await write_entry(
                native,
                plan,
                key,
                entry,
                by=by,
                instance=self.instance_id,
                audit_size=self.audit_size,
            )
        except REDIS_OUTAGES as exc:
            raise _unreachable(plan, f"cannot {what} {spec.name} {key}", exc) from exc

    async def recent_ticks(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        """Newest first: ``{instant, source, key, winner, fence, lateness_ms, skipped:
        [{instance, reason}]}``, merged across instances; `key` names the dynamic entry (None
        for the class's own cron). `instant` is ISO-8601 UTC; `lateness_ms` is the winner's. A
        pause or a resume is a row too (source "pause" or "resume", its `skipped` entry saying
        who asked), and so is an entry's add, change or remove (source "add", "change" or
        "remove"). Falls back to this instance's own records when Redis cannot be read.

        Args:
            name: a registered schedule's name (ValueError otherwise).
            limit: the most rows returned.
        """
        spec = self._spec(name)
        records: list[dict[str, Any]] = list(self.ticks.local_audit[name])
        if spec.lock is not None:
            try:
                async with asyncio.timeout(AUDIT_TIMEOUT_S):
                    native = self.ctx.lock(spec.lock.alias).native
                    raw = await native.lrange(audit.audit_key(spec.lock), 0, -1)
                records = [json.loads(item) for item in raw]
            except (*REDIS_OUTAGES, ValueError) as exc:
                logger.debug("audit of %r unreadable (%s); showing local records", name, exc)
        return audit.merge(records)[:limit]

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

    def _spec(self, name: str) -> ScheduleSpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise ValueError(f"no schedule named {name!r} (registered: {known})") from None


def _unreachable(plan: LockPlan, what: str, exc: BaseException) -> DependencyUnavailable:
    return DependencyUnavailable("redis", f"{what}: the Redis of lock {plan.alias!r}: {exc!r}")
