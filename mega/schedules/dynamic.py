"""Dynamic entries: a registered Schedule class run at run time under a key, with its own cron,
zone and arguments, added, changed and removed while the fleet runs (no redeploy).

    await scheduler.add("TenantReport", key="acme", cron="0 6 * * *",
                        timezone="Europe/Paris", args={"tenant": "acme"}, by="ada")
    await scheduler.remove("TenantReport", key="acme", by="ada")

An entry is kept in the Redis of the class's lock, in the hash ``<prefix>:entries`` (field: the
key; value: JSON ``{"cron", "timezone", "args", "at_ms", "by"}``). Every write also sets
``<prefix>:entries:changed`` to a new random token, and every running scheduler reads that
key each `ENTRIES_POLL_S` (bounded by `ENTRIES_READ_TIMEOUT_S`; the keys of every class on one
lock in one round trip): a new token makes it read the
hash and start, restart or stop its tick loops, so the fleet follows a change within about a
second. A random token rather than a counter: a counter lost with a Redis restarted empty would
count the same numbers again, and a scheduler could take a new change for one it has seen.

Each entry ticks like the class itself, through the class's lock, but under keys of its own
(``<prefix>:entry:<key>:tick:<epoch>`` claims, ``<prefix>:entry:<key>:running`` guard): so two
schedulers run each of its instants once, and a long run of one entry never holds back another.
The fence counter is the class's, so fences rise across all its entries.

The write and its audit record (who added, changed or removed which key) are one transaction.
An entry needs the class to have a lock; without one there is no shared Redis to keep it in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, ConfigDict, StrictStr, ValidationError
from redis.exceptions import RedisError, WatchError

from mega import clock
from mega.declaration import Declaration, describe, matching, rule
from mega.errors import ConfigError
from mega.schedules import audit, cron
from mega.schedules.audit import AuditSource, TickRecord
from mega.schedules.locks import REDIS_OUTAGES
from mega.schedules.schedule import LOCK_EXAMPLE, CronExpr, LockPlan, ScheduleSpec, ZoneName

if TYPE_CHECKING:
    from mega.drivers.redis.client import RedisClient

logger = logging.getLogger("mega.scheduler")

# How often a running scheduler reads the change token: the delay before the fleet follows an
# add, a change or a remove is about this.
ENTRIES_POLL_S = 1.0
# Bound on that read, so a Redis that does not answer cannot hold up the next poll for long.
ENTRIES_READ_TIMEOUT_S = 0.5
# Bound on reading every entry, or writing one with its audit record.
ENTRIES_TIMEOUT_S = 1.0
# A write retries this many times when a peer changed the same hash during it (WATCH).
WRITE_ATTEMPTS = 5
# Keys are part of Redis key names and log lines: a tenant id, a slug, an email address.
KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")


@dataclass(frozen=True)
class ScheduleEntry:
    """One dynamic entry of a Schedule class: its `key`, `cron`, `timezone` (None: the class's
    own), `args` (JSON values) and who wrote it last (`by`), when (`at_ms`, epoch ms)."""

    key: str
    cron: str
    timezone: str | None
    args: dict[str, Any]
    at_ms: int = 0
    by: str = ""

    def same_ticks(self, other: ScheduleEntry) -> bool:
        """Whether `other` ticks the same instants with the same arguments (who and when aside).

        Args:
            other: the entry to compare this one with.
        """
        return (self.cron, self.timezone, self.args) == (other.cron, other.timezone, other.args)


def _json_object(args: dict[str, Any]) -> dict[str, Any]:
    try:
        json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must hold JSON values only ({exc})") from None
    return args


class EntryDeclaration(Declaration):
    """What `add` is given, checked as the class's own cron and zone are (`ScheduleDeclaration`)."""

    model_config = ConfigDict(extra="forbid")

    key: Annotated[
        StrictStr,
        matching(KEY_PATTERN),
        rule("must be 1 to 128 letters, digits or . _ @ -, starting with a letter or digit"),
    ]
    cron: CronExpr
    timezone: ZoneName
    args: Annotated[
        Annotated[dict[str, Any], rule("must be a JSON object (a dict with string keys)")],
        AfterValidator(_json_object),
    ]


def validate_entry(
    name: str, key: object, cron_expr: object, timezone: object, args: object
) -> ScheduleEntry:
    """The entry, or ConfigError `schedule.entry_invalid` naming every bad field at once."""
    fields = {
        "key": key,
        "cron": cron_expr,
        "timezone": timezone,
        "args": {} if args is None else args,
    }
    try:
        valid = EntryDeclaration.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(describe(exc, EntryDeclaration))
        raise ConfigError(
            f"entry {key!r} of schedule {name!r} is invalid: {problems}",
            code="schedule.entry_invalid",
        ) from None
    return ScheduleEntry(valid.key, valid.cron, valid.timezone, dict(valid.args))


def entries_lock(spec: ScheduleSpec) -> LockPlan:
    """The class's lock, which its entries need; ConfigError `schedule.no_lock` without one."""
    if spec.lock is None:
        raise ConfigError(
            f"schedule {spec.name!r} has no lock, so it cannot have dynamic entries: they are "
            "kept in the Redis of the schedule's lock, which also runs each of their ticks "
            f"once; give the class a lock such as {LOCK_EXAMPLE}",
            code="schedule.no_lock",
        )
    return spec.lock


def entry_spec(spec: ScheduleSpec, entry: ScheduleEntry) -> ScheduleSpec:
    """What the Scheduler ticks for `entry`: the class with the entry's cron, zone, key, args.
    An entry without a zone takes the class's."""
    timezone = entry.timezone if entry.timezone is not None else spec.timezone
    return dataclasses.replace(
        spec,
        cron=entry.cron,
        timezone=timezone,
        zone=cron.resolve_zone(timezone),
        key=entry.key,
        args=entry.args,
    )


def changes(
    running: Mapping[str, ScheduleEntry], stored: Mapping[str, ScheduleEntry]
) -> tuple[list[str], list[ScheduleEntry]]:
    """What to do so the loops running here match the stored entries: the keys to stop, then the
    entries to start. A changed entry is in both (its loop restarts on the new cron)."""
    stop = [
        key
        for key, entry in running.items()
        if key not in stored or not entry.same_ticks(stored[key])
    ]
    start = [entry for key, entry in stored.items() if key not in running or key in stop]
    return stop, start


def entries_key(plan: LockPlan) -> str:
    return f"{plan.key_prefix}:entries"


def changed_key(plan: LockPlan) -> str:
    return f"{plan.key_prefix}:entries:changed"


def entry_prefix(plan: LockPlan, key: str) -> str:
    """The prefix of an entry's claims and guard."""
    return f"{plan.key_prefix}:entry:{key}"


def _entry_json(entry: ScheduleEntry) -> str:
    body = {"cron": entry.cron, "timezone": entry.timezone, "args": entry.args}
    return json.dumps({**body, "at_ms": entry.at_ms, "by": entry.by})


def _parse(key: str, raw: str | bytes) -> ScheduleEntry:
    """A stored entry, checked again: the hash may have been written by hand."""
    fields = json.loads(raw)
    entry = validate_entry("?", key, fields.get("cron"), fields.get("timezone"), fields.get("args"))
    return dataclasses.replace(entry, at_ms=fields.get("at_ms", 0), by=fields.get("by", ""))


def _stored(key: str, raw: str | bytes) -> ScheduleEntry:
    """What a write replaces: an unreadable record (written by hand) can still be removed."""
    try:
        return _parse(key, raw)
    except (ValueError, TypeError, ConfigError):
        return ScheduleEntry(key, "?", None, {})


async def read_entries(native: RedisClient, plan: LockPlan) -> dict[str, ScheduleEntry]:
    """Every entry now, by key. A record that does not read as one (written by hand) is left
    out with a warning. Raises what the client raises, TimeoutError past `ENTRIES_TIMEOUT_S`."""
    async with asyncio.timeout(ENTRIES_TIMEOUT_S):
        raw = await native.hgetall(entries_key(plan))
    entries = {}
    for field, value in raw.items():
        key = field.decode() if isinstance(field, bytes) else str(field)
        try:
            entries[key] = _parse(key, value)
        except (ValueError, TypeError, ConfigError) as exc:
            logger.warning("entry %r of %r unreadable (%r); left out", key, plan.key_prefix, exc)
    return dict(sorted(entries.items()))


async def write_entry(
    native: RedisClient,
    plan: LockPlan,
    key: str,
    entry: ScheduleEntry | None,
    *,
    by: str,
    instance: str,
    audit_size: int,
) -> ScheduleEntry | None:
    """Set the entry `key` (or delete it: `entry` None), a new change token and the audit record,
    in one transaction; the entry stored before, if any. Nothing is written when removing an
    absent key."""
    for _ in range(WRITE_ATTEMPTS):
        try:
            # Said, not the default: a Redis Cluster's pipeline is no transaction unless asked,
            # and its WATCH needs one (over keys of one slot: the prefix's hash tag).
            async with (
                asyncio.timeout(ENTRIES_TIMEOUT_S),
                native.pipeline(transaction=True) as pipe,
            ):
                await pipe.watch(entries_key(plan))
                raw = await pipe.hget(entries_key(plan), key)
                before = None if raw is None else _stored(key, raw)
                if entry is None and before is None:
                    return None
                pipe.multi()  # type: ignore[no-untyped-call]
                if entry is None:
                    pipe.hdel(entries_key(plan), key)
                else:
                    pipe.hset(entries_key(plan), key, _entry_json(entry))
                pipe.set(changed_key(plan), secrets.token_hex(8))
                audit.append(
                    pipe, plan, _change_record(key, before, entry, by, instance), audit_size
                )
                await pipe.execute()
                return before
        except WatchError:
            continue
    raise RedisError(f"{entries_key(plan)} kept changing during {WRITE_ATTEMPTS} attempts")


def _change_record(
    key: str, before: ScheduleEntry | None, after: ScheduleEntry | None, by: str, instance: str
) -> TickRecord:
    now = clock.utcnow().isoformat()
    source: AuditSource
    if after is None:
        source, word, what = "remove", "removed", ""
    else:
        source, word = ("add", "added") if before is None else ("change", "changed")
        what = f": {after.cron!r} in {after.timezone or 'the class zone'}"
    return TickRecord(
        instant=now,
        source=source,
        instance=instance,
        lateness_ms=0.0,
        outcome=word,
        reason=f"{word} by {by or '?'}{what}",
        key=key,
    )


async def watch_entries(
    native: RedisClient,
    alias: str,
    plans: Callable[[], Mapping[str, LockPlan]],
    apply: Callable[[str, dict[str, ScheduleEntry]], None],
) -> None:
    """Forever, each `ENTRIES_POLL_S`: read the change tokens of every class on the lock `alias`
    (`plans()`: by class name, read again each time) in one round trip, and for a class with a
    new token (and at first) call `apply(name, entries)`. An unreadable Redis keeps the loops as
    they are (their claims meet the same Redis and skip), logged once until it reads again."""
    seen: dict[str, bytes | str | None] = {}
    failing = False
    while True:
        watched = dict(plans())
        try:
            if watched:
                async with asyncio.timeout(ENTRIES_READ_TIMEOUT_S):
                    pipe = native.pipeline(transaction=False)
                    for plan in watched.values():
                        pipe.get(changed_key(plan))
                    tokens = await pipe.execute()
                for (name, plan), token in zip(watched.items(), tokens, strict=True):
                    if name not in seen or seen[name] != token:
                        apply(name, await read_entries(native, plan))
                        seen[name] = token
            if failing:
                logger.info("entries on lock %r read again", alias)
                failing = False
        except REDIS_OUTAGES as exc:
            if not failing:
                logger.warning(
                    "entries on lock %r unreadable (%r): their loops keep ticking as they were",
                    alias,
                    exc,
                )
                failing = True
        await asyncio.sleep(ENTRIES_POLL_S)
