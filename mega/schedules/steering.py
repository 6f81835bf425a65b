"""What a Scheduler answers and steers of its schedules for the whole fleet, through their
lock's Redis: `ScheduleSteering`, its base class, pauses and resumes a schedule, adds and
removes its dynamic entries (mega/schedules/dynamic.py) and reads its ticks' audit merged
across instances. None of it needs the Scheduler started: a console or a CLI command steers
the schedulers that run elsewhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

from mega import clock
from mega.context import Context
from mega.errors import DependencyUnavailable
from mega.schedules import audit
from mega.schedules.audit import AUDIT_TIMEOUT_S
from mega.schedules.dynamic import (
    ScheduleEntry,
    entries_lock,
    read_entries,
    validate_entry,
    write_entry,
)
from mega.schedules.locks import REDIS_OUTAGES
from mega.schedules.pause import SchedulePause, lock_of, read_pause, write_pause
from mega.schedules.schedule import LockPlan, ScheduleSpec
from mega.schedules.ticks import Ticks

logger = logging.getLogger("mega.scheduler")


class ScheduleSteering:
    """The pause, the dynamic entries and the audit of a Scheduler's schedules (see the
    module). What it needs of the Scheduler: `ctx` (its locks), `instance_id` and
    `audit_size` (for the audit records it writes), the registered specs and `ticks` (this
    instance's own audit records)."""

    ctx: Context
    instance_id: str
    audit_size: int
    ticks: Ticks
    _specs: dict[str, ScheduleSpec]

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

    def _spec(self, name: str) -> ScheduleSpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise ValueError(f"no schedule named {name!r} (registered: {known})") from None


def _unreachable(plan: LockPlan, what: str, exc: BaseException) -> DependencyUnavailable:
    return DependencyUnavailable("redis", f"{what}: the Redis of lock {plan.alias!r}: {exc!r}")
