"""Cron expressions: validate them and compute their next instants. Pure functions, no timers.

A thin layer over croniter, which does the field matching on naive wall-clock times; this module
adds the two things croniter leaves to its caller: the 6-field form with seconds FIRST, and real
time zones with correct daylight-saving behaviour.

Expressions
    5 fields: ``minute hour day-of-month month day-of-week`` (minute resolution): ``0 3 * * *``.
    6 fields: ``second minute hour day-of-month month day-of-week``: seconds come FIRST (as in
    croner and Quartz), so ``*/30 * * * * *`` is every 30 seconds. The aliases ``@hourly``,
    ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly`` are accepted too. When both
    day-of-month and day-of-week are restricted, a day matching either one fires (Vixie cron).

Time zones
    ``tz`` is an IANA name (``"Europe/Berlin"``), any ``tzinfo`` (``ZoneInfo``, ``timezone.utc``),
    or None for the host's local zone. Results are aware datetimes in that zone.

Daylight saving (the rule, with New York examples)
    Spring forward: local times inside the gap do not exist and are never invented. A
    ``30 2 * * *`` job does not run on 2024-03-10; an hourly job runs at 01:00 EST, then 03:00 EDT.
    Fall back: local times in the repeated hour exist twice. A schedule whose hour field is ``*``
    follows real time and fires on both passes (``0 * * * *`` runs 25 times on 2024-11-03); a
    schedule with a fixed hour fires once, on the first pass (``30 1 * * *`` runs at 01:30 EDT
    only). This is Vixie cron's rule: fixed-time jobs once, interval jobs by the real clock.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from mega import clock
from mega.errors import ConfigError
from mega.validation import int_problem

# Field counts: classic cron, and the same with a leading seconds field.
MINUTE_FIELDS = 5
SECOND_FIELDS = 6
# Where the host's zone lives on Linux and macOS when $TZ is not set.
LOCALTIME_PATH = "/etc/localtime"
ZONEINFO_DIR = "/zoneinfo/"
# Parsed expressions kept, since a scheduler asks for the next instant of the same few every tick.
PARSE_CACHE_SIZE = 256
# The @-shorthands croniter knows, all of them 5-field (minute resolution).
ALIASES = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)


class CronError(ConfigError, ValueError):
    """An invalid cron expression (code ``cron.invalid``) or time zone (``cron.timezone``)."""

    code = "cron.invalid"


def is_valid(expr: object) -> bool:
    """True when `expr` is a valid 5- or 6-field expression that ever fires. Never raises.

    Args:
        expr: the expression to check; anything but a string is not valid.
    """
    try:
        validate(expr)
    except Exception:
        return False
    return True


def validate(expr: object) -> None:
    """Raise CronError with a message a user can act on when `expr` is not a usable expression.

    Args:
        expr: the expression to check: 5 or 6 fields, or an @-alias such as ``@daily``.
    """
    _parse(expr)


def next(expr: str, after: datetime | None = None, tz: str | tzinfo | None = None) -> datetime:
    """The first instant strictly after `after`, as an aware datetime in `tz`.

    Args:
        expr: 5 or 6 fields, or an @-alias (CronError when it is not valid).
        after: the moment to count from, itself excluded; None is now. A naive datetime is
            read as a wall-clock time in `tz`.
        tz: an IANA name, a tzinfo, or None for the host's local zone.
    """
    runs = next_runs(expr, 1, after, tz)
    if not runs:
        raise CronError(f"cron expression {expr!r} has no run after {after}")
    return runs[0]


def next_runs(
    expr: str, n: int, after: datetime | None = None, tz: str | tzinfo | None = None
) -> list[datetime]:
    """The `n` first instants strictly after `after`, ascending, in `tz`.

    Args:
        expr: 5 or 6 fields, or an @-alias (CronError when it is not valid).
        n: how many instants, an int >= 0 (ValueError otherwise).
        after: the moment to count from, itself excluded; None is now. A naive datetime is
            read as a wall-clock time in `tz`.
        tz: an IANA name, a tzinfo, or None for the host's local zone.
    """
    problem = int_problem(n, minimum=0)
    if problem:
        raise ValueError(f"n {problem}")
    runs: list[datetime] = []
    for instant in instants(expr, after, tz):
        if len(runs) == n:
            break
        runs.append(instant)
    return runs


def instants(
    expr: str, after: datetime | None = None, tz: str | tzinfo | None = None
) -> Iterator[datetime]:
    """Every instant strictly after `after` (default: now), ascending, in `tz`: `next_runs`
    without an end, for a caller that keeps taking the next one (a scheduler's timetable), so
    the expression is read once and not at each instant."""
    parsed = _parse(expr)
    zone = resolve_zone(tz)
    if after is None:
        start = clock.utcnow()
    elif after.tzinfo is None:
        start = after.replace(tzinfo=zone).astimezone(UTC)
    else:
        start = after.astimezone(UTC)
    return (instant.astimezone(zone) for instant in _instants(parsed, zone, start))


def resolve_zone(tz: str | tzinfo | None) -> tzinfo:
    """A tzinfo for `tz`.

    Args:
        tz: an IANA name such as "Europe/Berlin" (CronError ``cron.timezone`` when unknown), a
            tzinfo (returned as is) or None (the host's local zone, see `local_zone`).
    """
    if tz is None:
        return local_zone()
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise CronError(f"time zone must be an IANA name, got {tz!r}", code="cron.timezone")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(
            f"unknown time zone {tz!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'",
            code="cron.timezone",
        ) from None


def local_zone() -> tzinfo:
    """The host's zone with its DST rules: $TZ, else /etc/localtime, else today's fixed offset."""
    name = os.environ.get("TZ", "").lstrip(":")
    if name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    # /etc/localtime usually links into the tz database: its path gives the zone a real name.
    target = os.path.realpath(LOCALTIME_PATH)
    if ZONEINFO_DIR in target:
        with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
            return ZoneInfo(target.split(ZONEINFO_DIR, 1)[1])
    try:
        with open(LOCALTIME_PATH, "rb") as file:
            return ZoneInfo.from_file(file, key="localtime")
    except (OSError, ValueError):
        # No tz database (Windows without tzdata): a fixed offset is the best left; it has no DST.
        fallback = datetime.now().astimezone().tzinfo
        return fallback if fallback is not None else UTC


class Cron:
    """The public namespace: ``Cron.is_valid``, ``validate``, ``next``, ``next_runs``."""

    is_valid = staticmethod(is_valid)
    validate = staticmethod(validate)
    next = staticmethod(next)
    next_runs = staticmethod(next_runs)
    resolve_zone = staticmethod(resolve_zone)


class _Parsed:
    """A checked expression in croniter's terms."""

    __slots__ = ("expr", "hour_wildcard", "seconds_first")

    def __init__(self, expr: str, seconds_first: bool, hour_wildcard: bool) -> None:
        self.expr = expr
        self.seconds_first = seconds_first
        # An hour field matching every hour makes the schedule follow real time on fall-back.
        self.hour_wildcard = hour_wildcard


def _parse(expr: object) -> _Parsed:
    if not isinstance(expr, str):
        raise CronError(f"cron expression must be a string, got {type(expr).__name__}")
    return _parse_text(expr)


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parse_text(expr: str) -> _Parsed:
    text = " ".join(expr.split())
    fields = text.split(" ") if text else []
    if text.lower() in ALIASES:
        seconds_first = False
    elif len(fields) in (MINUTE_FIELDS, SECOND_FIELDS):
        seconds_first = len(fields) == SECOND_FIELDS
    else:
        raise CronError(
            f"cron expression {expr!r} has {len(fields)} fields; expected 5 "
            "(minute hour day month weekday) or 6 (second minute hour day month weekday)"
        )
    try:
        expanded, _ = croniter.expand(text, second_at_beginning=seconds_first)
        # Finds "0 0 31 2 *" (never fires): croniter gives up after 50 years without a match.
        croniter(text, datetime(2000, 1, 1), second_at_beginning=seconds_first).get_next(datetime)
    except CroniterBadDateError:
        raise CronError(f"cron expression {expr!r} never fires (no matching date)") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise CronError(f"invalid cron expression {expr!r}: {exc}") from None
    hours = expanded[1]  # croniter's order: minute, hour, ... with seconds moved to the end
    return _Parsed(text, seconds_first, hours == ["*"] or len(hours) == 24)


def _walls(parsed: _Parsed, after_wall: datetime, zone: tzinfo) -> Iterator[datetime]:
    """Matching naive wall-clock times strictly after `after_wall` that exist in `zone`, ascending.

    A wall inside a spring-forward gap is never invented: the search resumes after the gap.
    """
    it = croniter(parsed.expr, after_wall, second_at_beginning=parsed.seconds_first)
    while True:
        try:
            wall: datetime = it.get_next(datetime)
        except CroniterBadDateError:
            return
        if _exists(wall, zone):
            yield wall
        else:
            resume = _gap_end(wall, zone) - timedelta(microseconds=1)
            it = croniter(parsed.expr, resume, second_at_beginning=parsed.seconds_first)


def _instants(parsed: _Parsed, zone: tzinfo, start: datetime) -> Iterator[datetime]:
    """Aware UTC instants strictly after `start` (UTC), ascending, under the DST rule above.

    Walls come in wall-clock order, and that is real-time order except in a repeated (fall-back)
    range: its second-pass instants (yielded only for hour-wildcard schedules) all fall between
    the last first-pass one and the first wall after the range, so they are replayed from a
    second iterator at that point.
    """
    local = start.astimezone(zone)
    wall_after = local.replace(tzinfo=None, fold=0)
    # [first, end) walls of a repeated range seen on its first pass, not yet replayed.
    pending: tuple[datetime, datetime] | None = None
    # End wall of the repeated range `start` is in on its second pass.
    second_pass_end: datetime | None = None
    if _is_ambiguous(wall_after, zone):
        if local.fold:
            second_pass_end = _repeated_range(wall_after, zone)[1]
        else:
            pending = _repeated_range(wall_after, zone)
    for wall in _walls(parsed, wall_after, zone):
        if pending is not None and wall >= pending[1]:
            yield from _second_pass(parsed, zone, pending, start)
            pending = None
        if second_pass_end is not None and wall < second_pass_end:
            # Still inside the repeat we started in: the first pass of these walls is past.
            if parsed.hour_wildcard:
                yield _utc(wall, zone, fold=1)
            continue
        second_pass_end = None
        if pending is None and _is_ambiguous(wall, zone):
            pending = _repeated_range(wall, zone)
        yield _utc(wall, zone, fold=0)
    if pending is not None:
        yield from _second_pass(parsed, zone, pending, start)


def _second_pass(
    parsed: _Parsed, zone: tzinfo, repeated: tuple[datetime, datetime], start: datetime
) -> Iterator[datetime]:
    if not parsed.hour_wildcard:
        return
    first, end = repeated
    for wall in _walls(parsed, first - timedelta(microseconds=1), zone):
        if wall >= end:
            return
        instant = _utc(wall, zone, fold=1)
        if instant > start:
            yield instant


def _utc(wall: datetime, zone: tzinfo, *, fold: int) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def _exists(wall: datetime, zone: tzinfo) -> bool:
    back = _utc(wall, zone, fold=0).astimezone(zone).replace(tzinfo=None, fold=0)
    return back == wall


def _is_ambiguous(wall: datetime, zone: tzinfo) -> bool:
    early = wall.replace(tzinfo=zone, fold=0).utcoffset()
    late = wall.replace(tzinfo=zone, fold=1).utcoffset()
    return early != late and _exists(wall, zone)


def _transition(lo: datetime, hi: datetime, zone: tzinfo) -> datetime:
    """The first UTC second in (lo, hi] whose offset differs from lo's (bisection)."""
    offset = lo.astimezone(zone).utcoffset()
    low, high = int(lo.timestamp()), int(hi.timestamp()) + 1
    while high - low > 1:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(zone).utcoffset() == offset:
            low = mid
        else:
            high = mid
    return datetime.fromtimestamp(high, UTC)


def _repeated_range(wall: datetime, zone: tzinfo) -> tuple[datetime, datetime]:
    """[first, end) walls of the repeated (fall-back) range that contains `wall`."""
    at = _transition(_utc(wall, zone, fold=0), _utc(wall, zone, fold=1), zone)
    first = at.astimezone(zone).replace(tzinfo=None, fold=0)
    before = (at - timedelta(seconds=1)).astimezone(zone).replace(tzinfo=None, fold=0)
    return first, before + timedelta(seconds=1)


def _gap_end(wall: datetime, zone: tzinfo) -> datetime:
    """The first wall that exists after the spring-forward gap containing `wall`."""
    at = _transition(_utc(wall, zone, fold=1), _utc(wall, zone, fold=0), zone)
    return at.astimezone(zone).replace(tzinfo=None, fold=0)
