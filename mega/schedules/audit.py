"""The tick audit: each scheduler instance's account of each tick, and who paused or resumed a
schedule or added, changed or removed one of its dynamic entries, kept as a JSON list in the
Redis of the schedule's lock at ``<prefix>:audit`` (the newest first, the last
`DEFAULT_AUDIT_SIZE` records of every instance together).

A record is a `TickRecord`. `merge` makes one row per tick of them, as `Scheduler.recent_ticks`
answers: ``{instant, source, key, winner, fence, lateness_ms, skipped: [{instance, reason}]}``,
`key` naming the dynamic entry a tick is of (None for the class's own cron). A pause or a
resume is a row of its own (source "pause" or "resume", no winner), its one "skipped" entry
naming the process that wrote it and, in the reason, who asked: so a page that shows the ticks
shows the change among them without knowing of it. So is the add, change or remove of an
entry (source "add", "change" or "remove", with the entry's key).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from mega.schedules.schedule import LockPlan, TickSource

if TYPE_CHECKING:
    from mega.drivers.redis.client import RedisPipeline

# Bound on one audit read or write, so a blackholed Redis cannot pile up tasks.
AUDIT_TIMEOUT_S = 1.0
# Records kept per schedule, all instances together (a Scheduler's `audit_size`).
DEFAULT_AUDIT_SIZE = 200

# What a record is of: a tick (scheduled or manual), a change of the schedule's pause, or a
# change of one of its dynamic entries.
AuditSource = TickSource | Literal["pause", "resume", "add", "change", "remove"]


@dataclass(frozen=True)
class TickRecord:
    """One instance's account of one tick, as stored in the audit (JSON)."""

    instant: str  # planned instant, ISO-8601 UTC (a manual tick or a change: when it was asked)
    source: AuditSource
    instance: str
    lateness_ms: float  # how long after `instant` the decision started
    # or "ran"; "paused" or "resumed" for a change of the pause; "added", "changed" or
    # "removed" for a change of a dynamic entry
    outcome: str = "skipped"
    reason: str | None = None
    fence: int | None = None
    key: str | None = None  # the dynamic entry's key; None for the class's own cron

    def as_dict(self) -> dict[str, Any]:
        """The record as stored (its fields are all plain values: no deep copy needed)."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}

    def event_fields(self, schedule: str, **extra: Any) -> dict[str, Any]:
        fields = {"instant": self.instant, "source": self.source, "instance": self.instance}
        return {"schedule": schedule, "key": self.key, **fields, **extra}


RECORD_FIELDS = tuple(field.name for field in dataclasses.fields(TickRecord))


def audit_key(plan: LockPlan) -> str:
    return f"{plan.key_prefix}:audit"


def append(pipe: RedisPipeline, plan: LockPlan, record: TickRecord, size: int) -> None:
    """Queue on `pipe` the push of `record` and the trim to the newest `size` records."""
    key = audit_key(plan)
    pipe.lpush(key, json.dumps(record.as_dict()))
    pipe.ltrim(key, 0, size - 1)


def merge(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group per-instance records by tick (instant + source + entry key), newest instant first."""
    ticks: dict[tuple[str, str, str | None], dict[str, Any]] = {}
    for record in records:
        # A record written before entries existed has no key: the class's own cron.
        instant, source, key = group = (record["instant"], record["source"], record.get("key"))
        if group not in ticks:
            ticks[group] = {"instant": instant, "source": source, "key": key, "winner": None}
            ticks[group].update(fence=None, lateness_ms=None, skipped=[])
        tick = ticks[group]
        if record["outcome"] == "ran":
            tick.update(winner=record["instance"], fence=record["fence"])
            tick["lateness_ms"] = record["lateness_ms"]
        else:
            tick["skipped"].append({"instance": record["instance"], "reason": record["reason"]})
    return sorted(ticks.values(), key=lambda t: datetime.fromisoformat(t["instant"]), reverse=True)
