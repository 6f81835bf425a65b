"""A schedule's pause: one record in the Redis of its lock, read by every scheduler at each tick.

    await scheduler.pause("NightlyReport", by="ada@ops-laptop")    # SchedulePause(True, ...)
    await scheduler.resume("NightlyReport", by="ada@ops-laptop")

The record is ``<prefix>:paused``, JSON ``{"paused", "at_ms", "by"}`` (no TTL). Every
scheduler instance reads it (bounded by `PAUSE_READ_TIMEOUT_S`; the records of every schedule
due at the same instant in one round trip) before it claims a planned tick, and skips a paused
schedule's tick with the reason "paused", so the whole fleet sees a change at its next tick.
A pause or a resume is written together with its audit record (the change, who asked and
when), in one transaction.

Only a schedule with a lock can be paused: without one there is no shared Redis to keep the
record in, and each instance runs every tick on its own.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mega import clock
from mega.errors import ConfigError
from mega.schedules import audit
from mega.schedules.audit import TickRecord
from mega.schedules.schedule import LOCK_EXAMPLE, LockPlan, ScheduleSpec

if TYPE_CHECKING:
    from mega.drivers.redis.client import RedisClient

# The read happens on each tick's path, before the claim: a Redis that does not answer delays
# the tick by at most this (and the claim that follows then fails on its own and skips).
PAUSE_READ_TIMEOUT_S = 0.5
# The skip reason of a paused schedule's ticks (signals, audit, status pages).
PAUSED_REASON = "paused"


@dataclass(frozen=True)
class SchedulePause:
    """A schedule's pause record: whether it is paused, since when (epoch ms) and who changed
    it last (for a resumed schedule: who resumed it, and when)."""

    paused: bool
    at_ms: int | None = None
    by: str | None = None


def pause_key(plan: LockPlan) -> str:
    return f"{plan.key_prefix}:paused"


def lock_of(spec: ScheduleSpec) -> LockPlan:
    """The schedule's lock, which a pause needs; ConfigError `schedule.no_lock` without one."""
    if spec.lock is None:
        raise ConfigError(
            f"schedule {spec.name!r} has no lock, so it cannot be paused: the pause is a record "
            f"in the Redis of the schedule's lock, read by every scheduler; give the class a "
            f"lock such as {LOCK_EXAMPLE}",
            code="schedule.no_lock",
        )
    return spec.lock


async def read_pause(native: RedisClient, plan: LockPlan) -> SchedulePause:
    """The record now (not paused when there is none). Raises what the client raises, and
    TimeoutError past `PAUSE_READ_TIMEOUT_S`."""
    async with asyncio.timeout(PAUSE_READ_TIMEOUT_S):
        raw = await native.get(pause_key(plan))
    return _pause(raw)


async def read_pauses(native: RedisClient, plans: list[LockPlan]) -> list[SchedulePause]:
    """The records of several schedules on one Redis in one round trip (a pipeline of GETs,
    which a cluster client splits by node), in the order of `plans`. Raises as `read_pause`."""
    async with asyncio.timeout(PAUSE_READ_TIMEOUT_S):
        pipe = native.pipeline(transaction=False)
        for plan in plans:
            pipe.get(pause_key(plan))
        raws = await pipe.execute()
    return [_pause(raw) for raw in raws]


def _pause(raw: str | bytes | None) -> SchedulePause:
    if raw is None:
        return SchedulePause(False)
    fields: dict[str, Any] = json.loads(raw)
    return SchedulePause(bool(fields.get("paused")), fields.get("at_ms"), fields.get("by"))


async def write_pause(
    native: RedisClient, plan: LockPlan, *, paused: bool, by: str, instance: str, audit_size: int
) -> SchedulePause:
    """Set the record, and push the change to the audit (written by `instance`), at once."""
    now = clock.now()
    record = SchedulePause(paused, int(now * 1000), by)
    word = "paused" if paused else "resumed"
    change = TickRecord(
        instant=datetime.fromtimestamp(now, UTC).isoformat(),
        source="pause" if paused else "resume",
        instance=instance,
        lateness_ms=0.0,
        outcome=word,
        reason=f"{word} by {by or '?'}",
    )
    body = {"paused": record.paused, "at_ms": record.at_ms, "by": record.by}
    async with asyncio.timeout(audit.AUDIT_TIMEOUT_S):
        pipe = native.pipeline(transaction=True)
        pipe.set(pause_key(plan), json.dumps(body))
        audit.append(pipe, plan, change, audit_size)
        await pipe.execute()
    return record
