"""`mega schedules ...`: control of a running fleet's schedules from a terminal.

mega schedules list [--json]               each schedule: cron, zone, next instant, paused,
                                           and its dynamic entries under it
mega schedules pause NAME [--by WHO]       its planned ticks are skipped from the next one
mega schedules add NAME --key KEY --cron EXPR [--timezone ZONE] [--args JSON] [--by WHO]
                                           a dynamic entry of NAME (or a change of one)
mega schedules remove NAME --key KEY [--by WHO]   its ticks stop within a second

Each command boots a context without the database, does one thing and says what it did in a
line per schedule. A name the config does not have is a ConfigError (exit 2, before any server
is reached); an operation that cannot be done is a MegaError (exit 1).
"""

from __future__ import annotations

import json
from typing import Any

from mega.config import Config
from mega.errors import ConfigError, MegaError, RegistrationError
from mega.runtime.bootstrap import boot, shutdown
from mega.runtime.cli_audit import audited, default_by
from mega.runtime.jobs_cli import pause_text
from mega.schedules.dynamic import ScheduleEntry
from mega.schedules.scheduler import Scheduler

SCHEDULE_ACTIONS = ("list", "pause", "resume", "add", "remove")


async def run_schedules_command(
    config: Config,
    action: str,
    *,
    name: str | None,
    by: str | None,
    as_json: bool = False,
    key: str | None = None,
    cron_expr: str | None = None,
    timezone: str | None = None,
    args: str | None = None,
) -> None:
    """Run one `mega schedules` action: `list` every schedule, pause or resume `name`, or add
    or remove its dynamic entry `key` (`cron_expr`, `timezone`, `args` a JSON object)."""
    schedules = config.schedules if name is None else [_schedule_named(config, name)]
    entry_args = _json_object(args) if action == "add" else None
    ctx = await boot(config, role="control", database=False)
    try:
        scheduler = Scheduler(ctx)  # never started: it reads and writes the records only
        for schedule in schedules:
            try:
                scheduler.register(schedule)
            except RegistrationError as exc:
                raise ConfigError(exc.message) from exc
        if action == "list":
            if not schedules:
                print(f"{config.path.name} lists no schedules")
            for registered in scheduler.names:
                await _describe(scheduler, registered, as_json)
        elif action in ("add", "remove"):
            [registered] = scheduler.names
            who = by if by is not None else default_by()
            await _change_entry(
                scheduler,
                registered,
                action,
                key=key or "",
                cron_expr=cron_expr or "",
                timezone=timezone,
                args=entry_args,
                by=who,
            )
        else:
            [registered] = scheduler.names
            who = by if by is not None else default_by()
            change = scheduler.pause if action == "pause" else scheduler.resume
            record = await change(registered, by=who)
            print(f"{registered}: {action}d by {record.by}")
            await audited(ctx, action, f"schedule:{registered}")
    finally:
        await shutdown(ctx)


def _json_object(text: str | None) -> Any:
    """`--args`: JSON text, parsed (whether it is an object is the entry's own check)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--args: not JSON ({exc}): {text!r}") from None


async def _change_entry(
    scheduler: Scheduler,
    name: str,
    action: str,
    *,
    key: str,
    cron_expr: str,
    timezone: str | None,
    args: Any,
    by: str,
) -> None:
    if action == "remove":
        removed = await scheduler.remove(name, key=key, by=by)
        if removed is None:
            raise MegaError(
                f"{name} has no entry with key {key!r}, nothing removed (`mega schedules list` "
                "shows them)"
            )
        print(f"{name} {key}: removed by {by}")
        return
    existed = {entry.key for entry in await scheduler.entries(name)}
    entry = await scheduler.add(name, key=key, cron=cron_expr, timezone=timezone, args=args, by=by)
    word = "changed" if key in existed else "added"
    print(f"{name} {key}: {word} by {by}, {_entry_text(scheduler.describe_entry(name, entry))}")


def _entry_text(settings: dict[str, Any]) -> str:
    return (
        f"{settings['cron']!r} in {settings['timezone']}, next {settings['next_runs'][0]}, "
        f"args {json.dumps(settings['args'])}"
    )


def _schedule_named(config: Config, name: str) -> type:
    for schedule in config.schedules:
        if schedule.__name__ == name or getattr(schedule, "name", None) == name:
            return schedule
    known = ", ".join(s.__name__ for s in config.schedules) or "none"
    raise ConfigError(f"NAME: no schedule named {name!r} in the config (schedules: {known})")


async def _describe(scheduler: Scheduler, name: str, as_json: bool) -> None:
    settings = scheduler.describe(name)
    pause = await scheduler.paused(name)
    entries = await scheduler.entries(name)
    if as_json:
        lock = settings["lock"]["lock"] if settings["lock"] else None
        line = {
            "name": name,
            "cron": settings["cron"],
            "timezone": settings["timezone"],
            "next_run": (settings["next_runs"] or [None])[0],
            "lock": lock,
            "paused": pause.paused,
            "paused_by": pause.by if pause.paused else None,
            "paused_at_ms": pause.at_ms if pause.paused else None,
            "entries": [_entry_json(scheduler, name, entry) for entry in entries],
        }
        print(json.dumps(line, separators=(",", ":")))
        return
    state = pause_text(pause.paused, pause.at_ms, pause.by)
    if settings["lock"] is None:
        state = "no lock: runs on every scheduler, cannot be paused"
    if settings["cron"] is None:
        print(f"{name}: no cron of its own (cron = None: its entries only), {state}")
    else:
        print(
            f"{name}: {settings['cron']!r} in {settings['timezone']}, next "
            f"{settings['next_runs'][0]}, {state}"
        )
    for entry in entries:
        described = scheduler.describe_entry(name, entry)
        print(f"  {entry.key}: {_entry_text(described)}, by {entry.by or '?'}")


def _entry_json(scheduler: Scheduler, name: str, entry: ScheduleEntry) -> dict[str, Any]:
    described = scheduler.describe_entry(name, entry)
    next_run = described.pop("next_runs")[0]
    return {**described, "next_run": next_run}
