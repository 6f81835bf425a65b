"""What the admin pages show, read from the app's registry and its buses: one `LaneView` per
job queue and listener group, the schedules with their audit, the scheduler instances. Pure
data in, plain dicts and dataclasses out, so that an app's own pages can show the same rows
(the sample's console does). One job's, one workflow's and one dead letter's views are in
job_views.py.

Every read is guarded on its own: a bus that does not answer marks its row unavailable (with
the error) and the rest of the page still renders.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mega.drivers.base import LaneStats
from mega.errors import MegaError

logger = logging.getLogger("mega.web.admin")

# A scheduler instance missing from both newest scheduled ticks is "silent" (see
# scheduler_instances); ticks read per schedule for the instances and the audit table.
RECENT_TICKS = 10
AUDIT_ROWS = 5
# The rate of a lane is measured between two reads at least this far apart.
RATE_MIN_GAP_S = 1.0


# -- names and times ---------------------------------------------------------------------------


def short_instance(instance_id: str) -> str:
    """`worker@host:4121:a1b2c3` -> `a1b2c3 (pid 4121)`: the random suffix tells two runs of
    one pid apart, the pid is what to kill; any other form -> its last 12 characters.

    Args:
        instance_id: an instance's id, `<role>@<host>:<pid>:<random>` as the hosts make them.
    """
    _, _, where = instance_id.rpartition("@")
    parts = where.split(":")
    if len(parts) >= 3 and parts[-2].isdigit():
        return f"{parts[-1]} (pid {parts[-2]})"
    return instance_id[-12:]


def role_of(instance_id: str) -> str:
    """`scheduler@host:1:abc` -> `scheduler`; "" when the id names no role."""
    role, at, _ = instance_id.partition("@")
    return role if at else ""


def utc_time(at_ms: int | None) -> str:
    """`2026-05-01 12:00:03 UTC`, or "—" for no time."""
    if at_ms is None:
        return "—"
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def action_rows(entries: Iterable[Any]) -> list[dict[str, str]]:
    """Audit entries (mega/audit.py) as the pages list them, newest first."""
    return [
        {
            "iso": e.at.isoformat(),
            "time": e.at.strftime("%Y-%m-%d %H:%M:%S UTC"),
            "actor": e.actor,
            "action": e.action,
            "detail": e.detail,
        }
        for e in entries
    ]


def iso_utc(at_ms: int | None) -> str:
    return "" if at_ms is None else datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()


def age(seconds: float | None) -> str:
    """A duration as one rounded unit: `42 s`, `3 min`, `5 h`, `2 d`; "—" for none."""
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def ago(at_ms: int | None, now_ms: int | None = None) -> str:
    if at_ms is None:
        return "—"
    now = now_ms if now_ms is not None else now_millis()
    return f"{age((now - at_ms) / 1000)} ago"


def now_millis() -> int:
    return int(time.time() * 1000)


def rate_text(per_s: float | None) -> str:
    """`12.5/s`, `3/min` below one a second, `0/s`; "—" when not measured yet."""
    if per_s is None:
        return "—"
    if per_s == 0:
        return "0/s"
    if per_s < 1:
        return f"{per_s * 60:.3g}/min"
    return f"{per_s:.3g}/s"


# A payload, a raw body or an error longer than this is shown cut, with a link to the whole
# record as JSON: a page of dead letters of 1 MiB payloads would weigh tens of MB.
SHOWN_CHARS = 16 * 1024


def clipped(text: str) -> tuple[str, bool]:
    """`text` cut at SHOWN_CHARS, and whether it was."""
    if len(text) <= SHOWN_CHARS:
        return text, False
    return text[:SHOWN_CHARS] + "\n…", True


def pretty_json(value: Any) -> str:
    """A payload as indented JSON (the template escapes it)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


# -- lanes ---------------------------------------------------------------------------------------


@dataclass
class RateSampler:
    """A lane's throughput from two reads of its stats: the messages that left it (stored,
    minus those pending or in flight) per second between the previous sample and now. One per
    app, in process; the first read of a lane has no rate."""

    samples: dict[tuple[str, str, str], tuple[float, int]] = field(default_factory=dict)
    rates: dict[tuple[str, str, str], float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    def rate(self, key: tuple[str, str, str], stats: LaneStats) -> float | None:
        left = max(0, stats.stored - stats.pending - stats.in_flight)
        now = self.clock()
        previous = self.samples.get(key)
        if previous is None:
            self.samples[key] = (now, left)
            return None
        at, before = previous
        if now - at >= RATE_MIN_GAP_S:
            self.rates[key] = max(0, left - before) / (now - at)
            self.samples[key] = (now, left)
        return self.rates.get(key)


@dataclass
class WorkerRow:
    """One consumer process seen on a lane."""

    worker: str
    short: str
    started_at: str
    seen_at: str
    seen_ago: str
    running: int | None
    done: int | None


def worker_rows(seen: Iterable[Any], now_ms: int | None = None) -> list[WorkerRow]:
    """`WorkerSeen`s (worker, started_at, seen_at, running, done; times in epoch ms) as rows,
    the most recently seen first."""
    rows = sorted(seen, key=lambda w: w.seen_at or 0, reverse=True)
    return [
        WorkerRow(
            worker=w.worker,
            short=short_instance(w.worker),
            started_at=utc_time(w.started_at),
            seen_at=utc_time(w.seen_at),
            seen_ago=ago(w.seen_at, now_ms),
            running=getattr(w, "running", None),
            done=getattr(w, "done", None),
        )
        for w in rows
    ]


@dataclass
class LaneView:
    """A job queue or a listener group on the overview."""

    kind: str  # "job" or "group"
    name: str
    bus: str
    cls: type[Any]
    dlq_url: str
    stats: LaneStats | None = None
    oldest: str = "—"
    rate: str = "—"
    paused: bool = False
    workers: list[WorkerRow] | None = None  # None: not known (the bus cannot say)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def oldest_text(stats: LaneStats, now_ms: int | None = None) -> str:
    """How long the oldest message not settled yet (waiting, or running) has been in the lane;
    `oldest_ms` is when it was enqueued (epoch ms)."""
    oldest = stats.oldest_ms
    if oldest is None:
        return "—"
    now = now_ms if now_ms is not None else now_millis()
    return age((now - oldest) / 1000)


def error_text(exc: BaseException) -> str:
    if isinstance(exc, MegaError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


# -- schedules -----------------------------------------------------------------------------------


def scheduler_instances(ticks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scheduler instances in these ticks, each with its last scheduled tick. Every live
    scheduler writes a record for every tick, won or skipped, so one missing from both newest
    ticks is `ticking` False: stopped, or far behind. (Two, not one: a peer's record of the
    newest tick may land a moment after the winner's.)

    Args:
        ticks: one schedule's audit rows, as `Scheduler.recent_ticks` gives them (newest
            first).
    """
    scheduled = [tick for tick in ticks if tick["source"] == "schedule"]
    last_seen: dict[str, str] = {}
    for tick in scheduled:
        names = [tick["winner"]] if tick["winner"] else []
        for name in names + [skipped["instance"] for skipped in tick["skipped"]]:
            last_seen.setdefault(name, tick["instant"])
    newest = {tick["instant"] for tick in scheduled[:2]}
    return [
        {"instance": name, "short": short_instance(name), "last_seen": at, "ticking": at in newest}
        for name, at in last_seen.items()
    ]


def merge_instances(per_schedule: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The instances of several schedules' audits as one list: each instance once, with its
    latest tick and `ticking` when any schedule saw it tick lately; newest first."""
    merged: dict[str, dict[str, Any]] = {}
    for instances in per_schedule:
        for item in instances:
            kept = merged.get(item["instance"])
            if kept is None:
                merged[item["instance"]] = dict(item)
                continue
            kept["ticking"] = kept["ticking"] or item["ticking"]
            if _instant(item["last_seen"]) > _instant(kept["last_seen"]):
                kept["last_seen"] = item["last_seen"]
    return sorted(merged.values(), key=lambda i: _instant(i["last_seen"]), reverse=True)


def _instant(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def tick_rows(ticks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Audit rows as the admin's table shows them: the instant in UTC (`time` HH:MM:SS), the
    winner's short name, who skipped and why.

    Args:
        ticks: audit rows, as `Scheduler.recent_ticks` gives them.
    """
    rows = []
    for tick in ticks:
        instant = _instant(tick["instant"]).astimezone(UTC)
        rows.append(
            {
                **tick,
                "utc": instant.isoformat(),
                "time": instant.strftime("%H:%M:%S"),
                "date": instant.strftime("%Y-%m-%d"),
                "winner_short": short_instance(tick["winner"]) if tick["winner"] else None,
                "skipped": [{**s, "short": short_instance(s["instance"])} for s in tick["skipped"]],
            }
        )
    return rows


def pause_text(paused: bool, at_ms: int | None, by: str | None) -> str:
    who = by or "someone"
    if paused:
        return f"Paused by {who} since {utc_time(at_ms)}" if at_ms else f"Paused by {who}"
    if at_ms:
        return f"Ticking; resumed by {who} at {utc_time(at_ms)}"
    return "Ticking"


def instance_rows(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Scheduler instance rows with their last tick in UTC, and their role.

    Args:
        instances: the rows `scheduler_instances` (or `merge_instances`) gives.
    """
    rows = []
    for item in instances:
        at = _instant(item["last_seen"]).astimezone(UTC)
        rows.append(
            {
                **item,
                "time": at.strftime("%H:%M:%S"),
                "utc": at.isoformat(),
                "role": role_of(item["instance"]),
            }
        )
    return rows
