"""One tick of a schedule, and its audit: `Ticks.tick` skips a paused planned tick, takes the
claim and guard of a locked one (mega/schedules/guard.py), runs the schedule with its `Tick`,
and reports each step as a signal (run, skip, done, fail, clock) and as a tick record, kept
here and pushed to the lock's Redis in the background (mega/schedules/audit.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mega import clock, tracing
from mega.context import Context, EarlyClaim, LockAdapter
from mega.errors import LockBackendError
from mega.schedules import audit
from mega.schedules.audit import AUDIT_TIMEOUT_S, TickRecord
from mega.schedules.guard import (
    REFUSAL_REASONS,
    acquire,
    guard_key,
    keep_guard,
    release_guard,
)
from mega.schedules.locks import REDIS_OUTAGES
from mega.schedules.pause import PAUSED_REASON, read_pauses
from mega.schedules.schedule import LockPlan, ScheduleSpec, Tick, TickSource
from mega.signals import Signals
from mega.tasks import cancel_and_wait

logger = logging.getLogger("mega.scheduler")

# An offset from the lock server's clock above this is logged once per lock: claims keep the
# ticks on time, but a clock this far off is one NTP no longer keeps.
CLOCK_OFFSET_WARN_MS = 250


@dataclass(frozen=True)
class TickResult:
    """What `run_now` reports: `ran` False with the `reason` when the lock logic skipped."""

    ran: bool
    reason: str | None = None
    fence: int | None = None
    error: str | None = None  # the run raised (a `fail` signal was sent too)


class Ticks:
    """The ticks of one Scheduler: `tick` runs one, `missed` records one not run; both report
    to `signals` and keep the last `audit_size` records of each schedule (`local_audit`)."""

    def __init__(self, ctx: Context, instance_id: str, signals: Signals, audit_size: int) -> None:
        self.ctx = ctx
        self.instance_id = instance_id
        self.signals = signals
        self.audit_size = audit_size
        self.active: dict[str, int] = {}  # runs in progress here, per schedule name
        self.local_audit: dict[str, deque[dict[str, Any]]] = {}
        self.audit_queue: dict[str, list[tuple[LockPlan, TickRecord]]] = {}  # by lock alias
        self.background: set[asyncio.Task[None]] = set()  # the audit pushes on their way
        self.audit_failing = False
        self.pause_unread: set[str] = set()  # the locks whose pause record could not be read
        self.clock_warned: set[str] = set()  # the locks whose clock offset was logged

    def add(self, name: str) -> None:
        """Keep the records of a newly registered schedule."""
        self.local_audit[name] = deque(maxlen=self.audit_size)

    async def tick(
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
            lateness_ms=round((clock.now() - planned.timestamp()) * 1000, 1),
            key=spec.key,
        )
        plan = spec.lock
        if plan is None:
            if self.active.get(spec.name):
                return await self.skip(spec, record, "overlap: still running here")
            tick = Tick(planned, None, source, self.instance_id)
            return await self._execute(spec, tick, record, extras=extras)
        if source == "schedule":
            if paused is None:
                paused = (await self.read_pauses(plan.alias, [plan]))[0]
            if paused:
                return await self.skip(spec, record, PAUSED_REASON)
        adapter = self.ctx.lock(plan.alias)
        note_clock = functools.partial(self.note_clock, spec.name, plan.alias)
        try:
            lease = await acquire(spec, adapter, planned, source, note_clock)
        except Exception as exc:  # any adapter failure is a skip, never a crash of the host
            detail = exc.message if isinstance(exc, LockBackendError) else repr(exc)
            return await self.skip(spec, record, f"lock backend error: {detail}")
        if isinstance(lease, EarlyClaim):
            reason = (
                f"early: the lock server's clock is {lease.wait_ms / 1000:.1f} s before the "
                "instant (this instance's clock is ahead); not run here"
            )
            return await self.skip(spec, record, reason)
        if isinstance(lease, str):
            return await self.skip(spec, record, REFUSAL_REASONS[lease])
        tick = Tick(planned, lease.fence, source, self.instance_id)
        return await self._execute(spec, tick, record, (adapter, lease.token), extras)

    async def missed(self, spec: ScheduleSpec, planned: datetime, late_s: float) -> TickResult:
        """Visible like any other skip (signal + audit), so a stalled host shows up."""
        reason = f"missed: this instance woke {late_s:.1f} s late; not replayed"
        missed = TickRecord(
            planned.isoformat(),
            "schedule",
            self.instance_id,
            round(late_s * 1000, 1),
            key=spec.key,
        )
        return await self.skip(spec, missed, reason)

    async def read_pauses(self, alias: str, plans: list[LockPlan]) -> list[bool]:
        """Whether each of `plans` (all on the lock `alias`) is paused, in one read. Unreadable
        (Redis down or slow, a record that is not JSON): not paused, logged once per lock until
        it reads again; a Redis that is down then fails the claims, which skip their ticks."""
        try:
            pauses = await read_pauses(self.ctx.lock(alias).native, plans)
        except (*REDIS_OUTAGES, ValueError) as exc:
            if alias not in self.pause_unread:
                self.pause_unread.add(alias)
                logger.warning(
                    "pause records on lock %r unreadable (%r): ticking as if not paused",
                    alias,
                    exc,
                )
            return [False] * len(plans)
        if alias in self.pause_unread:
            self.pause_unread.discard(alias)
            logger.info("pause records of lock %r read again", alias)
        return [pause.paused for pause in pauses]

    async def note_clock(self, name: str, alias: str, offset_ms: float | None) -> None:
        """Send the clock offset a claim measured; log it once per lock when it is too large."""
        if offset_ms is None:
            return
        if abs(offset_ms) > CLOCK_OFFSET_WARN_MS and alias not in self.clock_warned:
            self.clock_warned.add(alias)
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
        self.active[spec.name] = self.active.get(spec.name, 0) + 1
        self.record(spec, dataclasses.replace(record, outcome="ran", fence=tick.fence))
        run_extras = {**self.ctx.extras, **(extras or {}), "tick": tick}
        run_ctx = dataclasses.replace(self.ctx, extras=run_extras)
        keeper = None
        if guard is not None and spec.lock is not None:
            keeper = asyncio.create_task(keep_guard(spec.lock, guard_key(spec), *guard))
        started = time.monotonic()
        error: BaseException | None = None
        release_error: Exception | None = None
        try:
            with tracing.internal(
                f"tick {spec.name}",
                **{
                    "mega.schedule": spec.name,
                    "mega.key": spec.key,
                    "mega.fence": tick.fence,
                    "mega.source": record.source,
                },
            ):
                await self.signals.emit("run", **fields, lateness_ms=record.lateness_ms)
                await spec.schedule(tick, spec.key, spec.args).run(run_ctx)
        except (Exception, asyncio.CancelledError) as exc:
            error = exc
        finally:
            self.active[spec.name] -= 1
            await cancel_and_wait([keeper])
            if guard is not None and spec.lock is not None:
                release_error = await release_guard(spec.lock, guard_key(spec), *guard)
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

    async def skip(self, spec: ScheduleSpec, record: TickRecord, reason: str) -> TickResult:
        self.record(spec, dataclasses.replace(record, reason=reason))
        fields = record.event_fields(spec.name)
        await self.signals.emit("skip", **fields, reason=reason, lateness_ms=record.lateness_ms)
        return TickResult(ran=False, reason=reason)

    async def _fail(self, fields: dict[str, Any], phase: str, error: BaseException) -> None:
        if phase == "run" and not isinstance(error, asyncio.CancelledError):
            logger.error("schedule %r failed", fields["schedule"], exc_info=error)
        await self.signals.emit("fail", **fields, phase=phase, error=_error_text(error))

    # -- audit --------------------------------------------------------------------------------

    def record(self, spec: ScheduleSpec, record: TickRecord) -> None:
        """Keep the record here, and push it to Redis in the background (never delays a run):
        the records of a lock waiting meanwhile go together, in one round trip."""
        self.local_audit[spec.name].appendleft(record.as_dict())
        if spec.lock is not None:
            waiting = self.audit_queue.setdefault(spec.lock.alias, [])
            waiting.append((spec.lock, record))
            if len(waiting) == 1:  # else a push is on its way, and takes this one too
                task = asyncio.create_task(self._push_audit(spec.lock.alias))
                self.background.add(task)
                task.add_done_callback(self.background.discard)

    async def _push_audit(self, alias: str) -> None:
        await asyncio.sleep(0)  # the records of the ticks started in this turn come too
        records = self.audit_queue.pop(alias, [])
        try:
            async with asyncio.timeout(AUDIT_TIMEOUT_S):
                pipe = self.ctx.lock(alias).native.pipeline(transaction=False)
                for plan, record in records:
                    audit.append(pipe, plan, record, self.audit_size)
                await pipe.execute()
        except REDIS_OUTAGES as exc:
            if not self.audit_failing:
                logger.warning("tick audit not written to Redis (%s); kept locally", exc)
            self.audit_failing = True
            return
        if self.audit_failing:
            logger.info("tick audit written to Redis again")
            self.audit_failing = False


def _error_text(error: BaseException) -> str:
    if isinstance(error, asyncio.CancelledError):
        return "cancelled: the scheduler stopped before the run finished"
    return f"{type(error).__name__}: {error}"
