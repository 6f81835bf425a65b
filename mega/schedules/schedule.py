"""A schedule is a class: when it fires (`cron`, `timezone`), how the cluster shares it (`lock`)
and what it does (`async def run(self, ctx)`). The `Scheduler` runs it; this module only
describes and validates it.

    class NightlyReport(Schedule):
        cron = "0 3 * * *"
        timezone = "Europe/Berlin"
        lock = {"lock": "main", "ttl": 60_000}

        async def run(self, ctx: Context) -> None:
            await build_report(ctx, as_of=self.tick.instant, fence=self.tick.fence)

The scheduler makes one instance per run, so `self.tick` (the planned instant, the fencing
number, the source) belongs to that run alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, ClassVar, Literal, TypedDict

from mega.errors import RegistrationError
from mega.schedules import cron
from mega.validation import int_problem

if TYPE_CHECKING:
    from mega.context import Context

# Lock key prefix when `lock["key"]` is absent; the class name is appended.
DEFAULT_KEY_PREFIX = "mega:schedule:"
LOCK_KEYS = frozenset({"lock", "ttl", "key"})

TickSource = Literal["schedule", "manual"]


class LockSettings(TypedDict, total=False):
    """`lock` of a Schedule: `lock` (alias, required), `ttl` (ms, required), `key` (prefix)."""

    lock: str
    ttl: int
    key: str


@dataclass(frozen=True)
class Tick:
    """One firing of a schedule, as its run sees it.

    `instant` is the PLANNED fire time (aware, UTC), not the moment the run started; `fence` is
    the cluster-wide fencing number (strictly increasing per lock key prefix, None without a
    lock); `source` is "schedule" (the cron) or "manual" (`run_now`).
    """

    instant: datetime
    fence: int | None
    source: TickSource
    instance_id: str


class Schedule:
    """Base class of every schedule. Subclasses set `cron` and override `run`.

    Class attributes: `cron` (5 or 6 fields, see `mega.schedules.cron`), `timezone` (IANA name; None
    is the host's local time, with a warning at register), `lock` (absent: no cluster guard, the
    schedule runs on every instance), `name` (defaults to the class name).
    """

    cron: ClassVar[str]
    timezone: ClassVar[str | None] = None
    lock: ClassVar[LockSettings | None] = None
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __init__(self, tick: Tick) -> None:
        self.tick = tick

    async def run(self, ctx: Context) -> None:
        """The work of one tick. Raising makes a `fail` event (phase "run"); nothing retries."""
        raise NotImplementedError


@dataclass(frozen=True)
class LockPlan:
    """A validated `lock` setting: the adapter alias, the TTL (ms) and the Redis key prefix."""

    alias: str
    ttl_ms: int
    key_prefix: str


@dataclass(frozen=True)
class ScheduleSpec:
    """A validated schedule, with its settings resolved (what the Scheduler keeps)."""

    schedule: type[Schedule]
    name: str
    cron: str
    timezone: str | None
    zone: tzinfo
    lock: LockPlan | None


def validate_schedule(cls: object, lock_aliases: Collection[str]) -> ScheduleSpec:
    """Check every setting of a Schedule class at once; RegistrationError lists each bad field."""
    if not (isinstance(cls, type) and issubclass(cls, Schedule)):
        raise RegistrationError(f"{cls!r} is not a Schedule subclass")
    problems: list[str] = []
    label = cls.__dict__.get("name", cls.__name__)

    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        problems.append(f"name: must be a non-empty string, got {name!r}")
    expr = getattr(cls, "cron", None)
    if expr is None:
        problems.append('cron: missing; set e.g. cron = "*/5 * * * *"')
    else:
        try:
            cron.validate(expr)
        except cron.CronError as exc:
            problems.append(f"cron: {exc.message}")
    zone: tzinfo | None = None
    timezone = cls.timezone
    if timezone is not None and not isinstance(timezone, str):
        problems.append(f"timezone: must be an IANA name such as 'Europe/Berlin', got {timezone!r}")
    else:
        try:
            zone = cron.resolve_zone(timezone)
        except cron.CronError as exc:
            problems.append(f"timezone: {exc.message}")
    lock_alias, ttl_ms, key = _check_lock(cls.lock, lock_aliases, problems)
    if cls.run is Schedule.run:
        problems.append("run: not overridden; define `async def run(self, ctx)`")
    elif not inspect.iscoroutinefunction(cls.run):
        problems.append("run: must be `async def run(self, ctx)`")

    if problems:
        raise RegistrationError(f"schedule {label!r} is invalid: " + "; ".join(problems))
    assert isinstance(expr, str) and isinstance(name, str) and zone is not None
    plan = None
    if lock_alias is not None and ttl_ms is not None:
        plan = LockPlan(lock_alias, ttl_ms, key or DEFAULT_KEY_PREFIX + cls.__name__)
    return ScheduleSpec(cls, name, expr, timezone, zone, plan)


def _check_lock(
    lock: object, aliases: Collection[str], problems: list[str]
) -> tuple[str | None, int | None, str | None]:
    if lock is None:
        return None, None, None
    if not isinstance(lock, dict):
        problems.append(f'lock: must be a dict like {{"lock": "main", "ttl": 20000}}, got {lock!r}')
        return None, None, None
    unknown = sorted(str(k) for k in lock if k not in LOCK_KEYS)
    if unknown:
        problems.append(f"lock: unknown keys {unknown}; allowed: lock, ttl, key")
    alias = lock.get("lock")
    if not isinstance(alias, str) or not alias:
        problems.append(f"lock.lock: the lock alias is required (a string), got {alias!r}")
    elif alias not in aliases:
        declared = ", ".join(sorted(aliases)) or "none"
        problems.append(f"lock.lock: alias {alias!r} is not declared (declared: {declared})")
    ttl = lock.get("ttl")
    problem = int_problem(ttl, unit="milliseconds")
    if problem:
        problems.append(f"lock.ttl: {problem}")
    key = lock.get("key")
    if key is not None and (not isinstance(key, str) or not key):
        problems.append(f"lock.key: must be a non-empty string, got {key!r}")
    return (
        alias if isinstance(alias, str) else None,
        ttl if isinstance(ttl, int) else None,
        key if isinstance(key, str) else None,
    )
