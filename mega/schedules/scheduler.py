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
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster

from mega import tracing
from mega.context import Context, EarlyClaim, FencedLease, LockAdapter, Refusal
from mega.errors import DependencyUnavailable, LockBackendError, MegaError, RegistrationError
from mega.schedules import audit, cron
from mega.schedules.audit import AUDIT_TIMEOUT_S, DEFAULT_AUDIT_SIZE, TickRecord
from mega.schedules.dynamic import (
    ScheduleEntry,
    changes,
    entries_lock,
    entry_prefix,
    entry_spec,
    read_entries,
    validate_entry,
    watch_entries,
    write_entry,
)
from mega.schedules.locks import REDIS_OUTAGES
from mega.schedules.pause import (
    PAUSED_REASON,
    SchedulePause,
    lock_of,
    read_pause,
    read_pauses,
    write_pause,
)
from mega.schedules.schedule import (
    LockPlan,
    Schedule,
    ScheduleSpec,
    Tick,
    TickSource,
    require_lock_tag,
    validate_schedule,
)
from mega.schedules.timetable import Line, Timetable
from mega.signals import Observer, Signals
from mega.tasks import cancel_and_wait, wait_event

logger = logging.getLogger("mega.scheduler")
_T = TypeVar("_T")

SIGNALS = ("run", "skip", "done", "fail", "clock")
# An instant reached more than this late (event loop stalled, host suspended) counts as missed
# and is not fired: a burst of stale ticks would be worse than a gap.
LATE_LIMIT_S = 1.0
# The claim must outlive the clock skew between peers (up to a second), or a late peer could
# claim an instant again after the first claim expired; so never shorter than this.
CLAIM_MIN_TTL_MS = 60_000
# A claim found early waits for the lock server's clock and is tried again, up to this long in
# all: an instance further ahead than this has a broken clock, not a skewed one, and skips the
# tick (its peers run it) rather than pile up waiting ticks.
EARLY_WAIT_LIMIT_S = 60.0
# An offset from the lock server's clock above this is logged once per lock: claims keep the
# ticks on time, but a clock this far off is one NTP no longer keeps.
CLOCK_OFFSET_WARN_MS = 250
# Longest single sleep, so a wall-clock step (NTP) is noticed within this delay.
MAX_SLEEP_S = 30.0
# After cancelling runs that outlived `stop()`, how long to let their `finally` release guards.
CANCEL_GRACE_S = 2.0
# After an unexpected error in a schedule's loop, wait this long before ticking again.
LOOP_RETRY_S = 1.0
# The overlap guard is renewed this many times per TTL while its run lives: one renewal may
# fail (a Redis blip) and the next still lands before the guard expires.
GUARD_RENEWALS_PER_TTL = 3
# How many next instants `describe()` lists.
PREVIEW_RUNS = 5
# The skip reason for each refusal of `acquire_fenced` (signals, audit, status pages). Each
# instance records its own: on a tick inside a long run, the one that claimed it met the guard
# ("overlap") and the others met its claim ("claimed"), since the claim is taken first and kept.
REFUSAL_REASONS: dict[Refusal, str] = {
    "claimed": "claimed by another instance",
    "overlap": "overlap: the previous run still runs",
}


class GuardExpired(MegaError):
    """A run outlived its overlap guard's TTL (reported as a `fail` signal, phase "release")."""

    code = "schedule.guard_expired"


@dataclass(frozen=True)
class TickResult:
    """What `run_now` reports: `ran` False with the `reason` when the lock logic skipped."""

    ran: bool
    reason: str | None = None
    fence: int | None = None
    error: str | None = None  # the run raised (a `fail` signal was sent too)


class Scheduler:
    """Runs Schedule classes on their cron. Signals: run, skip, done, fail, clock.

    `stop_timeout_s` bounds how long `stop()` waits for running runs (seconds); `audit_size` is
    how many tick records are kept per schedule (all instances together).
    """

    def __init__(
        self,
        ctx: Context,
        *,
        instance_id: str | None = None,
        stop_timeout_s: float = 30.0,
        audit_size: int = DEFAULT_AUDIT_SIZE,
    ) -> None:
        self.ctx = ctx
        self.instance_id = instance_id or ctx.instance_id
        self.stop_timeout_s = stop_timeout_s
        self.audit_size = audit_size
        self.signals = Signals(SIGNALS)
        self._specs: dict[str, ScheduleSpec] = {}
        self._table = Timetable()  # every cron ticking here, by next instant
        self._clock: asyncio.Task[None] | None = None  # the one loop that fires what is due
        self._wake = asyncio.Event()  # set when a line is added: the clock sleeps again
        self._lines: dict[str, Line] = {}  # the class's own cron, by name
        # The dynamic entries ticking here, by name then key, each with its line.
        self._entry_lines: dict[str, dict[str, tuple[ScheduleEntry, Line]]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}  # the entries' watch, by lock alias
        self._runs: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._audit_queue: dict[str, list[tuple[LockPlan, TickRecord]]] = {}  # by lock alias
        self._active: dict[str, int] = {}  # runs in progress here, per schedule name
        self._local_audit: dict[str, deque[dict[str, Any]]] = {}
        self._audit_failing = False
        self._pause_unread: set[str] = set()  # the locks whose pause record could not be read
        self._clock_warned: set[str] = set()  # the locks whose clock offset was logged
        self._started = False

    def on(self, name: str, observer: Observer) -> Callable[[], None]:
        """Subscribe to a signal (ValueError for an unknown name); returns an unsubscribe."""
        return self.signals.on(name, observer)

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def register(self, schedule: type[Schedule]) -> Scheduler:
        """Validate every setting now (RegistrationError names each bad field); chainable."""
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
        self._local_audit[spec.name] = deque(maxlen=self.audit_size)
        if self._started:
            self._start_loop(spec)
        return self

    async def start(self) -> None:
        """Start ticking every registered schedule (idempotent): one clock loop for them all,
        and one reader of the dynamic entries per lock."""
        self._started = True
        for spec in self._specs.values():
            self._start_loop(spec)
        if self._clock is None:
            self._clock = self._spawn("clock", self._run_clock)

    async def stop(self, timeout_s: float | None = None) -> None:
        """No new ticks; wait up to `timeout_s` (default `stop_timeout_s`) for running runs,
        then cancel what is left (their guards are still released)."""
        self._started = False
        loops = [*self._watchers.values(), *([self._clock] if self._clock else [])]
        self._clock = None
        self._table = Timetable()
        self._lines.clear()
        self._watchers.clear()
        self._entry_lines.clear()
        await cancel_and_wait(loops)
        runs = set(self._runs)
        if runs:
            limit = self.stop_timeout_s if timeout_s is None else timeout_s
            _, late = await asyncio.wait(runs, timeout=limit)
            if late:
                logger.warning("stop: cancelling %d run(s) still going after %ss", len(late), limit)
                await cancel_and_wait(late, CANCEL_GRACE_S)
        if self._background:
            await asyncio.wait(set(self._background), timeout=CANCEL_GRACE_S)

    async def run_now(self, name: str, extras: dict[str, Any] | None = None) -> TickResult:
        """Run one tick of `name` now, through the overlap guard and fence (no per-instant
        claim: a manual tick is its own instant). `ran` is False with the reason on a skip.
        `extras` are added to this run's `ctx.extras` (what the caller of a manual tick asks
        of it, say how long to take). A paused schedule runs too: the pause stops the planned
        ticks, and a manual tick is someone asking for this one. It returns once its audit
        record is on Redis too (within AUDIT_TIMEOUT_S): `recent_ticks` then shows it on every
        instance, as the caller who just ran it expects."""
        spec = self._spec(name)
        result = await self._track(self._tick(spec, datetime.now(UTC), "manual", extras or {}))
        if self._background:  # the audit pushes (`_record`), this tick's among them
            await asyncio.wait(set(self._background), timeout=AUDIT_TIMEOUT_S)
        return result

    async def pause(self, name: str, *, by: str = "") -> SchedulePause:
        """Pause `name` on every instance: from the next tick on, each scheduler skips its
        planned ticks with the reason "paused" (a run already going finishes; `run_now` still
        runs). `by` says who, for the record and the audit. The Scheduler need not be started.
        ConfigError `schedule.no_lock` for a schedule without a lock; DependencyUnavailable
        when its Redis does not answer."""
        return await self._set_pause(name, paused=True, by=by)

    async def resume(self, name: str, *, by: str = "") -> SchedulePause:
        """Undo `pause`: every instance runs `name`'s next planned tick again."""
        return await self._set_pause(name, paused=False, by=by)

    async def paused(self, name: str) -> SchedulePause:
        """Whether `name` is paused, since when and by whom; after a resume, `paused` is False
        with who resumed it and when. A schedule without a lock is never paused."""
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
                native, plan, paused=paused, by=by, instance=self.instance_id,
                audit_size=self.audit_size,
            )  # fmt: skip
        except REDIS_OUTAGES as exc:
            what = "pause" if paused else "resume"
            raise _unreachable(plan, f"cannot {what} {name}", exc) from exc
        logger.info("schedule %r %s by %s", name, "paused" if paused else "resumed", by or "?")
        return record

    async def add(
        self, name: str, *, key: str, cron: str, timezone: str | None = None,
        args: dict[str, Any] | None = None, by: str = "",
    ) -> ScheduleEntry:  # fmt: skip
        """Run `name` under `key` on `cron` in `timezone` (None: the class's zone) with `args`
        (a JSON object; `self.args` in its runs), on every started scheduler within about a
        second, each instant once across them; besides the class's own cron. Adding a key
        that exists changes it (its loop restarts on the new cron). `by` says who, for the
        audit. The Scheduler need not be started. ConfigError `schedule.entry_invalid` for a
        bad key, cron, zone or args (nothing is written), `schedule.no_lock` for a class
        without a lock; DependencyUnavailable when its Redis does not answer."""
        spec = self._spec(name)
        plan = entries_lock(spec)
        entry = validate_entry(name, key, cron, timezone, args)
        entry = dataclasses.replace(entry, at_ms=int(time.time() * 1000), by=by)
        before = await self._write_entry(spec, plan, entry.key, entry, by, "add")
        word = "added" if before is None else "changed"
        logger.info(
            "schedule %r key %r %s by %s: %r in %s", name, key, word, by or "?", entry.cron,
            entry.timezone or spec.timezone,
        )  # fmt: skip
        return entry

    async def remove(self, name: str, *, key: str, by: str = "") -> ScheduleEntry | None:
        """Stop the entry `key` of `name` on every scheduler within about a second (a run
        already going finishes); the entry removed, or None when there was none (nothing is
        written then). Errors as `add`."""
        spec = self._spec(name)
        plan = entries_lock(spec)
        before = await self._write_entry(spec, plan, key, None, by, "remove")
        if before is not None:
            logger.info("schedule %r key %r removed by %s", name, key, by or "?")
        return before

    async def entries(self, name: str) -> list[ScheduleEntry]:
        """The dynamic entries of `name`, by key; none for a class without a lock."""
        spec = self._spec(name)
        if spec.lock is None:
            return []
        try:
            stored = await read_entries(self.ctx.lock(spec.lock.alias).native, spec.lock)
        except REDIS_OUTAGES as exc:
            raise _unreachable(spec.lock, f"cannot read the entries of {name}", exc) from exc
        return list(stored.values())

    async def _write_entry(
        self, spec: ScheduleSpec, plan: LockPlan, key: str, entry: ScheduleEntry | None, by: str,
        what: str,
    ) -> ScheduleEntry | None:  # fmt: skip
        native = self.ctx.lock(plan.alias).native
        try:
            return await write_entry(
                native, plan, key, entry, by=by, instance=self.instance_id,
                audit_size=self.audit_size,
            )  # fmt: skip
        except REDIS_OUTAGES as exc:
            raise _unreachable(plan, f"cannot {what} {spec.name} {key}", exc) from exc

    async def recent_ticks(self, name: str, limit: int = 20) -> list[dict[str, Any]]:
        """Newest first: ``{instant, source, key, winner, fence, lateness_ms, skipped:
        [{instance, reason}]}``, merged across instances; `key` names the dynamic entry (None
        for the class's own cron). `instant` is ISO-8601 UTC; `lateness_ms` is the winner's. A
        pause or a resume is a row too (source "pause" or "resume", its `skipped` entry saying
        who asked), and so is an entry's add, change or remove (source "add", "change" or
        "remove"). Falls back to this instance's own records when Redis cannot be read."""
        spec = self._spec(name)
        records: list[dict[str, Any]] = list(self._local_audit[name])
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
        for a class with `cron = None` (entries only: `describe_entry` gives theirs)."""
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
        none of its own) and next `PREVIEW_RUNS` instants, with its key, args and writer."""
        ticked = entry_spec(self._spec(name), entry)
        runs = cron.next_runs(entry.cron, PREVIEW_RUNS, tz=ticked.zone)
        return {
            "key": entry.key, "cron": entry.cron,
            "timezone": ticked.timezone or f"host local time ({ticked.zone})",
            "args": entry.args, "by": entry.by, "at_ms": entry.at_ms,
            "next_runs": [instant.isoformat() for instant in runs],
        }  # fmt: skip

    # -- the loop -----------------------------------------------------------------------------

    def _start_loop(self, spec: ScheduleSpec) -> None:
        if spec.cron is not None and spec.name not in self._lines:
            self._lines[spec.name] = self._table.add(spec, spec.cron)
            self._wake.set()
        if spec.lock is not None and spec.lock.alias not in self._watchers:
            alias = spec.lock.alias
            watch = functools.partial(
                watch_entries, self.ctx.lock(alias).native, alias,
                functools.partial(self._entry_plans, alias), self._apply_entries,
            )  # fmt: skip
            self._watchers[alias] = self._spawn(f"entries on lock {alias}", watch)

    def _entry_plans(self, alias: str) -> dict[str, LockPlan]:
        """The classes whose entries the reader of lock `alias` follows, by name."""
        return {
            spec.name: spec.lock
            for spec in self._specs.values()
            if spec.lock is not None and spec.lock.alias == alias
        }

    def _spawn(self, label: str, body: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        return asyncio.create_task(self._forever(label, body), name=f"mega.schedule:{label}")

    async def _forever(self, label: str, body: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await body()
            except Exception:
                # A bug here must not silently end the ticking: log, pause, start over from now.
                logger.exception("scheduler %s: loop error; restarting", label)
                await asyncio.sleep(LOOP_RETRY_S)

    def _apply_entries(self, name: str, stored: dict[str, ScheduleEntry]) -> None:
        """Start, restart and stop the entries' lines here to match `stored`."""
        spec = self._specs[name]
        lines = self._entry_lines.setdefault(name, {})
        stop, start = changes({key: entry for key, (entry, _) in lines.items()}, stored)
        for key in stop:
            self._table.remove(lines.pop(key)[1])  # only the line: a run already going finishes
            if key not in stored:
                logger.info("schedule %r key %r: removed, no more ticks here", name, key)
        for entry in start:
            ticked = entry_spec(spec, entry)
            lines[entry.key] = (entry, self._table.add(ticked, entry.cron))
            self._wake.set()
            logger.info(
                "schedule %r key %r: ticking on %r in %s", name, entry.key, ticked.cron,
                ticked.timezone or f"host local time ({ticked.zone})",
            )  # fmt: skip

    async def _run_clock(self) -> None:
        """Sleep until the first planned instant (or a new line), then fire all that is due."""
        while True:
            self._wake.clear()
            first = self._table.next_at()
            wait_s = MAX_SLEEP_S if first is None else min(first - time.time(), MAX_SLEEP_S)
            if wait_s > 0:
                await wait_event(self._wake, wait_s)
                continue
            self._fire(self._table.take_due(time.time()))

    def _fire(self, lines: list[Line]) -> None:
        """Start the tick of each line due, and put each back at its next instant. The locked
        ones go in one batch per lock: their pause records are read in one round trip."""
        now = time.time()
        batches: dict[str, list[tuple[ScheduleSpec, datetime]]] = {}
        for line in lines:
            spec, planned, late_s = line.spec, line.planned, now - line.at
            try:
                if late_s > LATE_LIMIT_S:
                    self._track(self._missed(spec, planned, late_s))
                elif spec.lock is None:
                    self._track(self._tick(spec, planned, "schedule"))
                else:
                    batches.setdefault(spec.lock.alias, []).append((spec, planned))
            finally:
                # From the planned instant, not from now: a late wake-up never drifts the
                # schedule; a missed one goes on from now (missed instants are not replayed).
                if late_s > LATE_LIMIT_S:
                    self._table.skip_to_now(line)
                else:
                    self._table.advance(line)
        for alias, due in batches.items():
            self._track(self._tick_batch(alias, due))

    async def _missed(self, spec: ScheduleSpec, planned: datetime, late_s: float) -> TickResult:
        """Visible like any other skip (signal + audit), so a stalled host shows up."""
        reason = f"missed: this instance woke {late_s:.1f} s late; not replayed"
        missed = TickRecord(
            planned.isoformat(), "schedule", self.instance_id, round(late_s * 1000, 1),
            key=spec.key,
        )  # fmt: skip
        return await self._skip(spec, missed, reason)

    async def _tick_batch(self, alias: str, due: list[tuple[ScheduleSpec, datetime]]) -> None:
        """The ticks due at once on the lock `alias`: their pauses in one read, then each."""
        plans = [spec.lock for spec, _ in due if spec.lock is not None]
        paused = await self._read_pauses(alias, plans)
        if not self._started:
            return  # stopped while reading: no new run
        for (spec, planned), is_paused in zip(due, paused, strict=True):
            self._track(self._tick(spec, planned, "schedule", paused=is_paused))

    def _track(self, tick: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        task = asyncio.create_task(tick)
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        return task

    # -- one tick -----------------------------------------------------------------------------

    async def _tick(
        self,
        spec: ScheduleSpec,
        planned: datetime,
        source: TickSource,
        extras: dict[str, Any] | None = None,
        paused: bool | None = None,
    ) -> TickResult:
        """One tick of `spec`; a planned one ("schedule") is skipped when the schedule is
        paused (`paused`, when the caller read it; else read here)."""
        record = TickRecord(
            instant=planned.isoformat(),
            source=source,
            instance=self.instance_id,
            lateness_ms=round((time.time() - planned.timestamp()) * 1000, 1),
            key=spec.key,
        )
        plan = spec.lock
        if plan is None:
            if self._active.get(spec.name):
                return await self._skip(spec, record, "overlap: still running here")
            tick = Tick(planned, None, source, self.instance_id)
            return await self._execute(spec, tick, record, extras=extras)
        if source == "schedule":
            if paused is None:
                paused = (await self._read_pauses(plan.alias, [plan]))[0]
            if paused:
                return await self._skip(spec, record, PAUSED_REASON)
        adapter = self.ctx.lock(plan.alias)
        try:
            lease = await self._acquire(spec, adapter, planned, source)
        except Exception as exc:  # any adapter failure is a skip, never a crash of the host
            detail = exc.message if isinstance(exc, LockBackendError) else repr(exc)
            return await self._skip(spec, record, f"lock backend error: {detail}")
        if isinstance(lease, EarlyClaim):
            reason = (
                f"early: the lock server's clock is {lease.wait_ms / 1000:.1f} s before the "
                "instant (this instance's clock is ahead); not run here"
            )
            return await self._skip(spec, record, reason)
        if isinstance(lease, str):
            return await self._skip(spec, record, REFUSAL_REASONS[lease])
        tick = Tick(planned, lease.fence, source, self.instance_id)
        return await self._execute(spec, tick, record, (adapter, lease.token), extras)

    async def _acquire(
        self, spec: ScheduleSpec, adapter: LockAdapter, planned: datetime, source: TickSource
    ) -> FencedLease | Refusal | EarlyClaim:
        """Claim, guard and fence in one call; while the lock server finds the claim early,
        wait for its clock to reach the instant (by its answer) and claim again, up to
        EARLY_WAIT_LIMIT_S. A manual tick is its own instant: no claim, only guard and fence.
        An entry's claims and guard are its own; the fence counter is the class's."""
        assert spec.lock is not None
        plan = spec.lock
        claim_key = None
        if source == "schedule":
            claim_key = f"{_own_prefix(spec)}:tick:{int(planned.timestamp())}"
        instant_ms = int(planned.timestamp() * 1000)
        waited_s = 0.0
        while True:
            lease = await adapter.acquire_fenced(
                _guard_key(spec),
                plan.ttl_ms,
                f"{plan.key_prefix}:fence",
                claim_key=claim_key,
                claim_ttl_ms=max(plan.ttl_ms, CLAIM_MIN_TTL_MS),
                claim_at_ms=instant_ms,
                # The planned instant (ms) keeps fences rising after a Redis restarted empty.
                fence_floor=instant_ms,
            )
            await self._note_clock(spec.name, plan.alias, adapter.clock_offset_ms)
            if not isinstance(lease, EarlyClaim):
                return lease
            waited_s += lease.wait_ms / 1000
            if waited_s > EARLY_WAIT_LIMIT_S:
                return lease
            await asyncio.sleep(lease.wait_ms / 1000)

    async def _read_pauses(self, alias: str, plans: list[LockPlan]) -> list[bool]:
        """Whether each of `plans` (all on the lock `alias`) is paused, in one read. Unreadable
        (Redis down or slow, a record that is not JSON): not paused, logged once per lock until
        it reads again; a Redis that is down then fails the claims, which skip their ticks."""
        try:
            pauses = await read_pauses(self.ctx.lock(alias).native, plans)
        except (*REDIS_OUTAGES, ValueError) as exc:
            if alias not in self._pause_unread:
                self._pause_unread.add(alias)
                logger.warning(
                    "pause records on lock %r unreadable (%r): ticking as if not paused",
                    alias, exc,
                )  # fmt: skip
            return [False] * len(plans)
        if alias in self._pause_unread:
            self._pause_unread.discard(alias)
            logger.info("pause records of lock %r read again", alias)
        return [pause.paused for pause in pauses]

    async def _note_clock(self, name: str, alias: str, offset_ms: float | None) -> None:
        """Send the clock offset a claim measured; log it once per lock when it is too large."""
        if offset_ms is None:
            return
        if abs(offset_ms) > CLOCK_OFFSET_WARN_MS and alias not in self._clock_warned:
            self._clock_warned.add(alias)
            logger.warning(
                "this scheduler's clock is %+.3f s off the lock server's (lock %r, Redis TIME; "
                "over %d ms): ticks still wait for their instant on the server's clock, but a "
                "clock behind makes this instance late and its log times are off; keep NTP on",
                offset_ms / 1000,
                alias,
                CLOCK_OFFSET_WARN_MS,
            )
        await self.signals.emit("clock", schedule=name, lock=alias, offset_ms=round(offset_ms, 1))

    async def _execute(
        self,
        spec: ScheduleSpec,
        tick: Tick,
        record: TickRecord,
        guard: tuple[LockAdapter, str] | None = None,
        extras: dict[str, Any] | None = None,
    ) -> TickResult:
        fields = record.event_fields(spec.name, fence=tick.fence)
        self._active[spec.name] = self._active.get(spec.name, 0) + 1
        self._record(spec, dataclasses.replace(record, outcome="ran", fence=tick.fence))
        run_extras = {**self.ctx.extras, **(extras or {}), "tick": tick}
        run_ctx = dataclasses.replace(self.ctx, extras=run_extras)
        keeper = None
        if guard is not None and spec.lock is not None:
            keeper = asyncio.create_task(_keep_guard(spec.lock, _guard_key(spec), *guard))
        started = time.monotonic()
        error: BaseException | None = None
        release_error: Exception | None = None
        try:
            with tracing.internal(
                f"tick {spec.name}", **{"mega.schedule": spec.name, "mega.key": spec.key,
                                        "mega.fence": tick.fence, "mega.source": record.source},
            ):  # fmt: skip
                await self.signals.emit("run", **fields, lateness_ms=record.lateness_ms)
                await spec.schedule(tick, spec.key, spec.args).run(run_ctx)
        except (Exception, asyncio.CancelledError) as exc:
            error = exc
        finally:
            self._active[spec.name] -= 1
            await cancel_and_wait([keeper])
            if guard is not None and spec.lock is not None:
                release_error = await _release_guard(spec.lock, _guard_key(spec), *guard)
        duration_ms = round((time.monotonic() - started) * 1000, 1)
        if error is None:
            await self.signals.emit("done", **fields, duration_ms=duration_ms)
        else:
            await self._fail(fields, "run", error)
        if release_error is not None:
            await self._fail(fields, "release", release_error)
        if isinstance(error, asyncio.CancelledError):
            raise error
        message = None if error is None else _error_text(error)
        return TickResult(ran=True, fence=tick.fence, error=message)

    async def _skip(self, spec: ScheduleSpec, record: TickRecord, reason: str) -> TickResult:
        self._record(spec, dataclasses.replace(record, reason=reason))
        fields = record.event_fields(spec.name)
        await self.signals.emit("skip", **fields, reason=reason, lateness_ms=record.lateness_ms)
        return TickResult(ran=False, reason=reason)

    async def _fail(self, fields: dict[str, Any], phase: str, error: BaseException) -> None:
        if phase == "run" and not isinstance(error, asyncio.CancelledError):
            logger.error("schedule %r failed", fields["schedule"], exc_info=error)
        await self.signals.emit("fail", **fields, phase=phase, error=_error_text(error))

    # -- audit --------------------------------------------------------------------------------

    def _record(self, spec: ScheduleSpec, record: TickRecord) -> None:
        """Keep the record here, and push it to Redis in the background (never delays a run):
        the records of a lock waiting meanwhile go together, in one round trip."""
        self._local_audit[spec.name].appendleft(record.as_dict())
        if spec.lock is not None:
            waiting = self._audit_queue.setdefault(spec.lock.alias, [])
            waiting.append((spec.lock, record))
            if len(waiting) == 1:  # else a push is on its way, and takes this one too
                task = asyncio.create_task(self._push_audit(spec.lock.alias))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _push_audit(self, alias: str) -> None:
        await asyncio.sleep(0)  # the records of the ticks started in this turn come too
        records = self._audit_queue.pop(alias, [])
        try:
            async with asyncio.timeout(AUDIT_TIMEOUT_S):
                pipe = self.ctx.lock(alias).native.pipeline(transaction=False)
                for plan, record in records:
                    audit.append(pipe, plan, record, self.audit_size)
                await pipe.execute()
        except REDIS_OUTAGES as exc:
            if not self._audit_failing:
                logger.warning("tick audit not written to Redis (%s); kept locally", exc)
            self._audit_failing = True
            return
        if self._audit_failing:
            logger.info("tick audit written to Redis again")
            self._audit_failing = False

    # -- helpers ------------------------------------------------------------------------------

    def _spec(self, name: str) -> ScheduleSpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise ValueError(f"no schedule named {name!r} (registered: {known})") from None


def _unreachable(plan: LockPlan, what: str, exc: BaseException) -> DependencyUnavailable:
    return DependencyUnavailable("redis", f"{what}: the Redis of lock {plan.alias!r}: {exc!r}")


def _own_prefix(spec: ScheduleSpec) -> str:
    """The prefix of the claims and guard of what `spec` ticks: the class, or one entry of it."""
    assert spec.lock is not None
    if spec.key is None:
        return spec.lock.key_prefix
    return entry_prefix(spec.lock, spec.key)


def _guard_key(spec: ScheduleSpec) -> str:
    return f"{_own_prefix(spec)}:running"


async def _release_guard(
    plan: LockPlan, key: str, adapter: LockAdapter, token: str
) -> Exception | None:
    """Release the overlap guard `key`; the error to report, if any (never raises)."""
    try:
        if await adapter.release(key, token):
            return None
    except Exception as exc:
        return exc
    return GuardExpired(
        f"the overlap guard expired before the run ended: it is renewed every "
        f"{plan.ttl_ms // GUARD_RENEWALS_PER_TTL} ms (lock.ttl is {plan.ttl_ms} ms), so the "
        "renewals failed (Redis unreachable, or the event loop blocked longer than the ttl) and "
        "a peer could have started the next tick"
    )


async def _keep_guard(plan: LockPlan, key: str, adapter: LockAdapter, token: str) -> None:
    """Renew the overlap guard `key` while its run lives (cancelled when the run ends). Stops
    once the guard is lost: the release then reports it (`GuardExpired`)."""
    while True:
        await asyncio.sleep(plan.ttl_ms / GUARD_RENEWALS_PER_TTL / 1000)
        try:
            if not await adapter.extend(key, token, plan.ttl_ms):
                logger.warning("overlap guard %r lost during the run; not renewed", key)
                return
        except Exception as exc:  # a Redis blip: the next renewal may still land in time
            logger.warning("overlap guard %r not renewed (%s); retrying", key, exc)


def _error_text(error: BaseException) -> str:
    if isinstance(error, asyncio.CancelledError):
        return "cancelled: the scheduler stopped before the run finished"
    return f"{type(error).__name__}: {error}"
