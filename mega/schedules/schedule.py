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
number, the source) belongs to that run alone. A class may also run as dynamic entries, added at
run time with a key, a cron and arguments (`mega.schedules.dynamic`): the run of an entry finds
them in `self.key` and `self.args`.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypedDict

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mega.declaration import Declaration, rule, validate_declaration
from mega.errors import RegistrationError
from mega.schedules import cron

if TYPE_CHECKING:
    from mega.context import Context

# Lock key prefix when `lock["key"]` is absent; the class name is appended, as a hash tag.
DEFAULT_KEY_PREFIX = "mega:schedule:"

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

    Class attributes: `cron` (5 or 6 fields, see `mega.schedules.cron`; `cron = None`: no ticks
    of its own, the class runs through its dynamic entries only, and needs a lock), `timezone`
    (IANA name; None is the host's local time, with a warning at register), `lock` (absent: no
    cluster guard, the schedule runs on every instance), `name` (defaults to the class name).

    Each run gets its own instance, with `self.tick`, `self.key` and `self.args` as given to
    `__init__`.
    """

    cron: ClassVar[str | None]
    timezone: ClassVar[str | None] = None
    lock: ClassVar[LockSettings | None] = None
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __init__(
        self, tick: Tick, key: str | None = None, args: Mapping[str, Any] | None = None
    ) -> None:
        """One run's instance; the scheduler makes one for each tick.

        Args:
            tick: the firing this run is (a `Tick`), kept as `self.tick`.
            key: the key of the dynamic entry this run is a tick of, kept as `self.key`; None
                for the class's own cron.
            args: that entry's arguments (JSON values), kept as the dict `self.args`; None
                gives {}, as for the class's own cron.
        """
        self.tick = tick
        self.key = key
        self.args: dict[str, Any] = dict(args or {})

    async def run(self, ctx: Context) -> None:
        """The work of one tick. Raising makes a `fail` event (phase "run"); nothing retries.

        Args:
            ctx: the scheduler's context, shallow-copied for this run, with this run's Tick
                also in `ctx.extras["tick"]`.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class LockPlan:
    """A validated `lock` setting: the adapter alias, the TTL (ms) and the Redis key prefix."""

    alias: str
    ttl_ms: int
    key_prefix: str


@dataclass(frozen=True)
class ScheduleSpec:
    """A validated schedule, with its settings resolved (what the Scheduler keeps). A dynamic
    entry of the class is the same with its own `cron` and zone, its `key` and its `args`."""

    schedule: type[Schedule]
    name: str
    cron: str | None  # None: the class ticks through its dynamic entries only
    timezone: str | None
    zone: tzinfo
    lock: LockPlan | None
    key: str | None = None
    args: Mapping[str, Any] = field(default_factory=dict)


LOCK_EXAMPLE = '{"lock": "main", "ttl": 20000}'


def _valid_cron(expr: object, info: ValidationInfo) -> object:
    if expr is None:
        if (info.context or {}).get("entries_only"):
            return None
        raise ValueError('missing; set e.g. cron = "*/5 * * * *"')
    try:
        cron.validate(expr)
    except cron.CronError as exc:
        raise ValueError(exc.message) from None
    return expr


def _known_zone(timezone: str | None) -> str | None:
    try:
        cron.resolve_zone(timezone)
    except cron.CronError as exc:
        raise ValueError(exc.message) from None
    return timezone


# A cron expression and a time zone, as a Schedule class declares them and as a dynamic entry
# of it is given them: one validation for both. A class may say `cron = None` (entries only).
CronExpr = Annotated[str, BeforeValidator(_valid_cron)]
OwnCron = Annotated[str | None, BeforeValidator(_valid_cron)]
ZoneName = Annotated[
    StrictStr | None,
    rule("must be an IANA name such as 'Europe/Berlin'"),
    AfterValidator(_known_zone),
]


class LockDeclaration(Declaration):
    """A Schedule's `lock` dict; an absent `lock` or `ttl` reads as None."""

    model_config = ConfigDict(extra="forbid")

    lock: str
    ttl: Annotated[StrictInt, Field(ge=1), rule("must be a positive int (milliseconds)")]
    key: Annotated[
        Annotated[StrictStr, Field(min_length=1)] | None, rule("must be a non-empty string")
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _absent_as_none(cls, data: object) -> object:
        return {"lock": None, "ttl": None, **data} if isinstance(data, dict) else data

    @field_validator("lock", mode="before")
    @classmethod
    def _declared_lock(cls, alias: object, info: ValidationInfo) -> str:
        if not isinstance(alias, str) or not alias:
            raise ValueError(f"the lock alias is required (a string), got {alias!r}")
        aliases: Collection[str] = (info.context or {}).get("lock_aliases", ())
        if alias not in aliases:
            declared = ", ".join(sorted(aliases)) or "none"
            raise ValueError(f"alias {alias!r} is not declared (declared: {declared})")
        return alias


class ScheduleDeclaration(Declaration):
    """The class attributes of a Schedule, in the order its problems are reported."""

    # Not blank: a pattern is searched for anywhere in the string.
    name: Annotated[StrictStr, Field(pattern=r"\S"), rule("must be a non-empty string")]
    cron: OwnCron
    timezone: ZoneName
    lock: LockDeclaration | None
    run: Any

    @field_validator("lock", mode="before")
    @classmethod
    def _a_dict(cls, lock: object, info: ValidationInfo) -> object:
        if lock is None and "cron" in info.data and info.data["cron"] is None:
            raise ValueError(
                "required with cron = None: the class then runs through its dynamic entries "
                f"only, which are kept in the Redis of its lock; set e.g. lock = {LOCK_EXAMPLE}"
            )
        if lock is not None and not isinstance(lock, dict):
            raise ValueError(f"must be a dict like {LOCK_EXAMPLE}, got {lock!r}")
        return lock

    @field_validator("run")
    @classmethod
    def _async_run(cls, run: object) -> object:
        if run is Schedule.run:
            raise ValueError("not overridden; define `async def run(self, ctx)`")
        if not inspect.iscoroutinefunction(run):
            raise ValueError("must be `async def run(self, ctx)`")
        return run


def key_prefix(key: str | None, class_name: str) -> str:
    """The prefix of a schedule's Redis keys: the `key` given, else `mega:schedule:{<Class>}`,
    whose hash tag (the part in braces, which alone picks a Redis Cluster's slot) keeps the
    keys a tick claims in one script in one slot."""
    return key if key is not None else DEFAULT_KEY_PREFIX + "{" + class_name + "}"


def has_hash_tag(key: str) -> bool:
    """Whether a Redis Cluster hashes `key` by a tag: the text between its first `{` and the
    first `}` after it, when not empty."""
    opened = key.find("{")
    return opened >= 0 and key.find("}", opened + 1) > opened + 1


def require_lock_tag(spec: ScheduleSpec, clustered: bool) -> None:
    """RegistrationError when the schedule's lock is on a Redis Cluster (`clustered`) and its
    key has no hash tag: a tick's claim, guard and fence must share a slot."""
    lock = spec.lock
    if lock is not None and clustered and not has_hash_tag(lock.key_prefix):
        raise RegistrationError(
            f"schedule {spec.name!r}: lock key {lock.key_prefix!r} has no hash tag, and lock "
            f"{lock.alias!r} is on a Redis Cluster, where a tick's claim, guard and fence "
            f"must share a slot: tag the key, e.g. '{{{lock.key_prefix}}}'"
        )


def validate_schedule(cls: object, lock_aliases: Collection[str]) -> ScheduleSpec:
    """Check every setting of a Schedule class at once; RegistrationError lists each bad field."""
    if not (isinstance(cls, type) and issubclass(cls, Schedule)):
        raise RegistrationError(f"{cls!r} is not a Schedule subclass")
    label = cls.__dict__.get("name", cls.__name__)
    # `cron = None` said in so many words, not a cron forgotten.
    declared = next((vars(k)["cron"] for k in cls.__mro__ if "cron" in vars(k)), "")
    schedule = validate_declaration(
        ScheduleDeclaration,
        cls,
        f"schedule {label!r} is invalid: ",
        {"lock_aliases": lock_aliases, "entries_only": declared is None},
    )
    lock = schedule.lock
    plan = None
    if lock is not None:
        plan = LockPlan(lock.lock, lock.ttl, key_prefix(lock.key, cls.__name__))
    zone = cron.resolve_zone(schedule.timezone)
    return ScheduleSpec(cls, schedule.name, schedule.cron, schedule.timezone, zone, plan)
