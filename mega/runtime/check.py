"""`mega check`: every class a config declares, validated as the hosts would, without a server.

Each `check_*` function is pure: a Config in, a list of Findings out. An error is what a host
refuses (a bad field, a duplicate); a warning is what no host refuses but what fails silently:
a listener on an event nothing declares (its rows may never be relayed), an event nobody hears,
an outbox no worker of this config relays, a job of the project that `jobs` lacks. `mega check`
prints them all; `mega start`, `scheduler`, `worker` and `work` run the same checks before they
connect, so a mistake in a class is reported as itself and not as "cannot reach NATS".
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from mega.config import Config
from mega.drivers.base import pattern_matcher
from mega.drivers.redis.urls import REDIS_CLUSTER_SCHEMES
from mega.errors import ConfigError, MegaError, RegistrationError
from mega.events.listener import ListenerSpec, validate_listener
from mega.events.spec import EventSpec, validate_event
from mega.jobs.spec import JobBase, validate_job
from mega.schedules.schedule import ScheduleSpec, require_lock_tag, validate_schedule
from mega.workers.worker import Worker, WorkerSettings

Level = Literal["error", "warning"]
S = TypeVar("S")


@dataclass(frozen=True)
class Finding:
    """One problem: `subject` names the config entry and the class (`jobs: EmailJob`),
    `message` what is wrong and how to fix it."""

    level: Level
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.subject}: {self.message}"


def check_config(config: Config) -> list[Finding]:
    """Every finding of the config's declarations: schedules, jobs, workers, then events and
    listeners, and whether the outbox is relayed."""
    return [
        *check_schedules(config),
        *check_jobs(config),
        *check_workers(config),
        *check_events(config),
        *check_relay(config),
    ]


def check_schedules(config: Config) -> list[Finding]:
    """Each schedule as `mega scheduler` registers it; names must differ."""

    def validate(cls: Any) -> ScheduleSpec:
        try:
            spec = validate_schedule(cls, config.locks.keys())
        except RegistrationError as exc:
            raise RegistrationError(exc.message + _lock_hint(cls, config)) from None
        require_lock_tag(spec, spec.lock is not None and _on_cluster(config, spec.lock.alias))
        return spec

    specs, findings = _validated(config.schedules, "schedules", validate)
    return findings + _duplicates("schedules", [(c, s.name) for c, s in specs], "name")


def check_jobs(config: Config) -> list[Finding]:
    """Each job as `mega worker` registers it; a class listed twice is refused there. And a
    warning for each job of the project that `jobs` lacks."""
    specs, findings = _validated(config.jobs, "jobs", lambda cls: validate_job(cls, config.buses))
    return [
        *findings,
        *_duplicates("jobs", [(c, c) for c, _ in specs], "class"),
        *flow_caches("jobs", specs, config),
        *unlisted_jobs(config),
    ]


def flow_caches(entry: str, specs: Iterable[tuple[Any, Any]], config: Config) -> list[Finding]:
    """An error for each class with a `rate_limit` or a `key_concurrency` whose cache (its
    `flow_cache`) the config lacks (or, naming none, a config without exactly one cache): the
    worker would refuse to start."""
    found = []
    for cls, spec in specs:
        if spec.rate_limit is None and spec.key_concurrency is None:
            continue
        alias, declared = spec.flow_cache, ", ".join(sorted(config.caches)) or "none"
        if alias is None and len(config.caches) != 1:
            message = (
                f"rate_limit and key_concurrency count in a cache; the config declares "
                f'{declared}: name one with flow_cache = "<alias>"'
            )
        elif alias is not None and alias not in config.caches:
            message = (
                f"flow_cache names cache {alias!r}, which services.caches lacks "
                f"(declared: {declared})"
            )
        else:
            continue
        found.append(Finding("error", f"{entry}: {_name(cls)}", message))
    return found


def unlisted_jobs(config: Config) -> list[Finding]:
    """A warning for each Job class of the config's own project (the packages beside the config
    that it imports from) that `jobs` does not list: enqueueing it works, and no worker of
    this config ever runs it. Only the classes the config's imports load are seen."""
    if config.module is None:
        return []
    packages = _project_packages(config.module, config.path.parent)
    # The config's own classes by identity: an earlier config of the same module name may
    # still have classes alive.
    own = {value for value in vars(config.module).values() if isinstance(value, type)}
    listed = set(config.jobs)
    return [
        Finding(
            "warning",
            f"jobs: {cls.__name__}",
            f"a Job of {cls.__module__} that `jobs` does not list: enqueueing it works, and no "
            f"`mega worker` of this config runs it, so its jobs wait forever; add {cls.__name__} "
            "to `jobs` (unless the workers of another config run it)",
        )
        for cls in _concrete_jobs()
        if cls not in listed and (cls in own or cls.__module__.partition(".")[0] in packages)
    ]


def _concrete_jobs() -> Iterator[type[JobBase]]:
    """Every loaded Job class that names a subject, subclasses before their own subclasses."""
    seen: set[type[JobBase]] = set()
    stack = list(reversed(JobBase.__subclasses__()))
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if isinstance(getattr(cls, "subject", None), str):
            yield cls
        stack.extend(reversed(cls.__subclasses__()))


def _project_packages(module: ModuleType, folder: Path) -> set[str]:
    """The top-level modules the config imports from whose files are under its folder."""
    folder = folder.resolve()
    packages = set()
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        top = (name or "").partition(".")[0]
        path = getattr(sys.modules.get(top), "__file__", None)
        if top and top != module.__name__ and path and Path(path).resolve().is_relative_to(folder):
            packages.add(top)
    return packages


def check_workers(config: Config) -> list[Finding]:
    """Each CPU pool as `mega start` starts it (its task module imported); two pools of one
    name would be one `ctx.workers[name]`, the other lost."""

    def validate(cls: Any) -> WorkerSettings:
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise RegistrationError("a worker must be a subclass of mega.Worker")
        return cls.validate(config.root)

    settings, findings = _validated(config.workers, "workers", validate)
    return findings + _duplicates("workers", [(c, s.name) for c, s in settings], "name")


def check_events(config: Config) -> list[Finding]:
    """Each event and listener group as `mega worker` registers them (groups must differ), and
    a warning for an event no group hears and for a group whose event `events` lacks."""
    events, event_findings = _validated(
        config.events, "events", lambda cls: validate_event(cls, config.buses)
    )
    listeners, listener_findings = _validated(
        config.listeners,
        "listeners",
        lambda cls: validate_listener(
            cls, config.buses, config.caches, database=bool(config.database_url)
        ),
    )
    event_specs = [spec for _, spec in events]
    listener_specs = [spec for _, spec in listeners]
    return [
        *event_findings,
        *listener_findings,
        *_duplicates("listeners", [(c, s.group) for c, s in listeners], "group"),
        *flow_caches("listeners", listeners, config),
        *unheard_events(event_specs, listener_specs),
        *undeclared_events(listener_specs, event_specs),
    ]


def unheard_events(events: Iterable[EventSpec], listeners: Iterable[ListenerSpec]) -> list[Finding]:
    """A warning for each declared event no listener group hears."""
    listeners = list(listeners)
    return [
        Finding(
            "warning",
            f"events: {event.event_cls.__name__}",
            f"no listener hears {event.name!r}: its events are relayed and kept for a group "
            "that may come later; add a Listener to `listeners`, or drop it from `events`",
        )
        for event in events
        if not any(_hears(listener, event) for listener in listeners)
    ]


def undeclared_events(
    listeners: Iterable[ListenerSpec], events: Iterable[EventSpec]
) -> list[Finding]:
    """A warning for each listener group whose event `events` does not declare: the relay runs
    only for a config that declares events, and only declared events are checked."""
    events = list(events)
    found = []
    for listener in listeners:
        event = listener.listener_cls.event
        if isinstance(event, type):
            if any(spec.event_cls is event for spec in events):
                continue
            message = (
                f"hears {event.__name__}, which `events` does not declare: it is never checked, "
                "and a worker relays the outbox only when `events` declares some; add "
                f"{event.__name__} to `events`"
            )
        else:
            if any(_hears(listener, spec) for spec in events):
                continue
            message = (
                f"hears {event!r}, and no event of `events` on bus {listener.bus!r} has a name "
                "it matches, so it may hear nothing; add the Event classes it should hear to "
                "`events`, or fix the pattern"
            )
        found.append(Finding("warning", f"listeners: {listener.listener_cls.__name__}", message))
    return found


def check_relay(config: Config) -> list[Finding]:
    """A warning when this config's workers would not relay the outbox its listeners need
    (`mega worker` relays only when `events` declares some and `outbox.relay` is on)."""
    if config.listeners and not config.events:
        return [
            Finding(
                "warning",
                "events",
                "empty while `listeners` has groups: `mega worker` runs no outbox relay, so "
                "events added with outbox.add stay pending; list your Event classes in `events`",
            )
        ]
    if config.events and config.outbox.relay is False:
        return [
            Finding(
                "warning",
                "outbox",
                "relay = False: no worker of this config relays the outbox, so its rows stay "
                "pending unless a worker of another config does; remove `relay: False` if not",
            )
        ]
    return []


def summary(config: Config, findings: list[Finding]) -> str:
    """`mega check`'s last line: what it checked and whether it is ok."""
    errors = sum(1 for finding in findings if finding.level == "error")
    warnings = len(findings) - errors
    if errors:
        return f"mega check: {_count(errors, 'error')}, {_count(warnings, 'warning')}"
    kinds = ("schedule", "job", "worker", "event", "listener")
    counted = (_count(len(getattr(config, f"{kind}s")), kind) for kind in kinds)
    return f"mega check: {', '.join(counted)} ok" + (
        f" ({_count(warnings, 'warning')})" if warnings else ""
    )


def enforce(config: Config, warn: Callable[[str], None]) -> None:
    """What a host runs before it connects: ConfigError listing every error, and each warning
    passed to `warn` once."""
    findings = check_config(config)
    errors = [str(finding) for finding in findings if finding.level == "error"]
    if errors:
        listed = "\n  ".join(errors)
        raise ConfigError(f"{_count(len(errors), 'problem')} in {config.path.name}:\n  {listed}")
    for finding in findings:
        warn(str(finding))


def _validated(
    classes: Iterable[Any], entry: str, validate: Callable[[Any], S]
) -> tuple[list[tuple[Any, S]], list[Finding]]:
    """Each class `validate` accepts with what it returned, and an error for each it refuses."""
    valid: list[tuple[Any, S]] = []
    findings = []
    for cls in classes:
        try:
            valid.append((cls, validate(cls)))
        except MegaError as exc:
            findings.append(Finding("error", f"{entry}: {_name(cls)}", exc.message))
    return valid, findings


def _duplicates(entry: str, keyed: list[tuple[Any, object]], what: str) -> list[Finding]:
    """An error for each class whose key an earlier one of `entry` has already."""
    seen: dict[object, Any] = {}
    found = []
    for cls, key in keyed:
        if key in seen:
            if seen[key] is cls:
                problem = "listed twice"
            else:
                problem = f"has the {what} of {_name(seen[key])} ({key!r})"
            message = f"{problem}: a host refuses it; keep one, or give each its own {what}"
            found.append(Finding("error", f"{entry}: {_name(cls)}", message))
        else:
            seen[key] = cls
    return found


def _hears(listener: ListenerSpec, event: EventSpec) -> bool:
    return listener.bus == event.bus and pattern_matcher(listener.pattern)(event.name)


def _on_cluster(config: Config, lock: str) -> bool:
    """Whether a cache of the lock `lock` is a Redis Cluster, by its URL."""
    caches = config.locks.get(lock, [])
    return any(urlsplit(config.caches[alias]).scheme in REDIS_CLUSTER_SCHEMES for alias in caches)


def _lock_hint(cls: Any, config: Config) -> str:
    """The fix when a schedule's lock names a cache, not a lock: declare a lock on it."""
    lock = getattr(cls, "lock", None)
    alias = lock.get("lock") if isinstance(lock, dict) else None
    if alias in config.caches and alias not in config.locks:
        return (
            f"; {alias!r} is a cache, not a lock: declare one on it, services.locks = "
            f'{{"{alias}": {{"driver": "redlock", "caches": ["{alias}"]}}}}'
        )
    return ""


def _name(cls: Any) -> str:
    return str(getattr(cls, "__name__", repr(cls)))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
