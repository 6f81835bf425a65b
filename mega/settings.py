"""The settings of a config file's sections: `services` (caches, locks, buses and their URLs,
the database), `auth` (logins, sessions, roles), `metrics`, `outbox` (its relay) and `work`
(`mega work`), and what every config model shares. The config file as a whole, and how it is
loaded, is mega/config.py.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mega.constants import BUILT_IN_DRIVERS, DRIVERS_ENTRY_POINT_GROUP

PositiveInt = Annotated[StrictInt, Field(gt=0)]
Port = Annotated[StrictInt, Field(gt=0, lt=65536)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Shown:
    """What the config reference (`mega.runtime.config_reference`) says of a key beyond its
    annotation: `type` where the annotation is too loose to read (`list[type]`), `env` the
    variable that replaces the key's value when set (`build_config` reads it)."""

    type: str = ""
    env: str = ""


# A console user's access, lowest first: each level may do what the ones before it may.
Role = Literal["viewer", "operator", "admin"]


class AuthConfig(Model):
    """Login options. Failed logins are limited per (username, client IP) pair, with a delay
    that doubles after the second failure, and per client IP across usernames, both within
    `login_window_s`; and per account across every IP within `login_account_window_s`, a limit
    a browser that logged in before (its device cookie) is exempt from."""

    secret_key: Annotated[str, Shown(env="MEGA_SECRET_KEY")] = Field(
        description="Signs the session cookies; at least 32 characters, required outside "
        "`mega dev` (which uses a fixed key) by the hosts that sign cookies."
    )
    session_max_age_s: PositiveInt = Field(
        default=8 * 3600, description="Seconds a login session lasts (8 hours)."
    )
    login_max_failures: PositiveInt = Field(
        default=5,
        description="Failed logins allowed per (username, client IP) pair within `login_window_s`.",
    )
    login_ip_max_failures: PositiveInt = Field(
        default=50,
        description="Failed logins allowed per client IP, every username, within "
        "`login_window_s`: high, for an office behind one NAT address.",
    )
    login_window_s: PositiveInt = Field(
        default=15 * 60,
        description="Seconds the per-pair and per-IP failure counts last (15 minutes).",
    )
    login_account_max_failures: PositiveInt = Field(
        default=100,
        description="Failed logins allowed per account, from every IP, within "
        "`login_account_window_s` (OWASP ASVS 2.2.1: at most 100 an hour).",
    )
    login_account_window_s: PositiveInt = Field(
        default=3600, description="Seconds the per-account failure count lasts (1 hour)."
    )
    device_cookie_max_age_s: PositiveInt = Field(
        default=30 * 24 * 3600,
        description="Seconds the device cookie a login leaves exempts its browser from the "
        "per-account limit (30 days).",
    )
    landing_path: Annotated[str, Field(pattern=r"^/([^/\\].*)?$")] = Field(
        default="/",
        description="The local path a login lands on when it was not sent from a page "
        "(no `next=`).",
    )
    users: Annotated[
        dict[Annotated[str, Field(min_length=1, max_length=64)], str],
        Shown(type="dict of username (1-64 characters) -> password"),
    ] = Field(
        default={},
        description="Users the web host creates at start; a password changed since is set back.",
    )
    roles: Annotated[
        dict[Annotated[str, Field(min_length=1, max_length=64)], Role],
        Shown(type="dict of username -> viewer | operator | admin"),
    ] = Field(
        default={},
        description="Each user's access to the console: viewer (reads), operator (also retry, "
        "requeue, cancel, pause, resume, run now), admin (also purge and delete). A user not "
        "named here has `default_role`.",
    )
    default_role: Role = Field(
        default="viewer",
        description="The access of a logged-in user that `roles` does not name.",
    )


class MetricsConfig(Model):
    enabled: StrictBool = Field(
        default=False,
        description="Export Prometheus metrics: the scheduler and worker hosts on their own "
        "ports, the web app on /metrics.",
    )
    bind: Annotated[str, Shown(env="MEGA_METRICS_BIND")] = Field(
        default="0.0.0.0",
        description="The address the scheduler's and worker's metrics ports listen on "
        "(`mega dev` sets 127.0.0.1: on a laptop nothing outside needs them).",
    )
    scheduler_port: Port = Field(default=9101, description="The scheduler host's metrics port.")
    worker_port: Port = Field(default=9102, description="The worker host's metrics port.")
    token: Annotated[
        Annotated[str, Field(min_length=16)] | None, Shown(env="MEGA_METRICS_TOKEN")
    ] = Field(
        default=None,
        description="When set, a scrape of the web app's /metrics (on the public port) must "
        "send `Authorization: Bearer` and this token.",
    )
    web: StrictBool = Field(
        default=True, description="Serve /metrics on the web app; False: none there."
    )


class OutboxConfig(Model):
    """The relay each `mega worker` runs when the config declares `events` (or `relay` is
    True: jobs enqueued with `outbox.enqueue` and no events)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    relay: StrictBool | None = Field(
        default=None,
        description="Run the outbox relay in this config's worker hosts: None (the default) "
        "when the config declares events, True always (jobs enqueued through the outbox "
        "without events), False never.",
    )
    batch: PositiveInt = Field(
        default=2000, description="Outbox rows per publish batch (SQLite writers wait for one)."
    )
    poll_s: Annotated[float, Field(gt=0)] = Field(
        default=0.5,
        description="Seconds the relay waits before looking again when no commit woke it.",
    )
    retention_s: Annotated[float, Field(ge=0)] = Field(
        default=3600.0, description="Seconds published rows are kept before they are deleted."
    )
    paused: Annotated[Callable[..., Any] | None, Shown(type="async function or None")] = Field(
        default=None,
        description="`async def paused(ctx) -> bool`: while it returns True the relay "
        "publishes nothing (rows pile up in the outbox).",
    )


class WorkConfig(Model):
    """`mega work`: what the single process runs beyond jobs, listeners and the relay."""

    scheduler: StrictBool = Field(
        default=False, description="Also tick the schedules in `mega work` (as --with-scheduler)."
    )


def check_bus_urls(driver: str, urls: list[str]) -> str:
    """A bus's URLs as its driver checks them (`check_urls` in the driver's package, found by
    the driver's name as mega.drivers finds the class, without importing the engine's client);
    ValueError saying what is wrong."""
    target = BUILT_IN_DRIVERS.get(driver)
    if target is None:
        from importlib.metadata import entry_points

        points = entry_points(group=DRIVERS_ENTRY_POINT_GROUP)
        target = next((point.value for point in points if point.name == driver), "")
    package = target.partition(":")[0]
    check: Callable[[list[str]], str] | None = None
    if package:
        with contextlib.suppress(ImportError):  # an added driver that cannot load: boot says so
            check = getattr(importlib.import_module(package), "check_urls", None)
    if check is None:
        check = importlib.import_module("mega.drivers.urls").check_urls
    return check(urls)


def check_redis_url(url: str) -> str:
    """A cache's URL: a Redis server, Cluster or Sentinel service (mega.drivers.redis.urls)."""
    urls = importlib.import_module("mega.drivers.redis.urls")
    result: str = urls.check_redis_url(url)
    return result


class CacheSpec(Model):
    driver: Literal["redis"] = Field(description="The cache's engine; only Redis for now.")
    url: Annotated[str, AfterValidator(check_redis_url), Shown(env="REDIS_<ALIAS>_URL")] = Field(
        description="Where the Redis server is: redis://, rediss:// (TLS) or unix://; a Redis "
        "Cluster: redis+cluster://host:port[,host:port...] (rediss+cluster:// over TLS); a "
        "primary under Sentinel: redis+sentinel://host:port[,host:port...]/service[/db], the "
        "sentinels' addresses and the name they monitor it by (rediss+sentinel:// over TLS)."
    )


class LockSpec(Model):
    driver: Literal["redlock"] = Field(
        description="The lock's algorithm: Redlock, over one Redis or a quorum of several."
    )
    caches: Annotated[list[str], Field(min_length=1)] | None = Field(
        default=None,
        description="The cache aliases the lock takes its keys on: one is a single Redis, "
        "several independent ones make a quorum (a majority must agree). Each names an entry "
        "of `services.caches`.",
    )
    cache: str | None = Field(
        default=None, description="One cache alias, the short form of `caches = [alias]`."
    )

    @model_validator(mode="after")
    def one_or_more(self) -> LockSpec:
        if not self.caches and not self.cache:
            raise ValueError("list the cache aliases the lock uses in `caches`")
        return self

    @property
    def cache_aliases(self) -> list[str]:
        return list(self.caches) if self.caches else [str(self.cache)]


class BusSpec(Model):
    """One bus alias: which driver moves its jobs and events, and where its engine is."""

    driver: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = Field(
        description="The driver that moves the bus's jobs and events: a built-in one (`nats`, "
        "`redis`, `postgres`, `memory`) or one a package adds through the `mega.drivers` "
        "entry-point group (checked at boot)."
    )
    url: Annotated[str | list[str], Shown(env="NATS_<ALIAS>_URL")] = Field(
        default="",
        description="Where the engine is. nats: nats:// or tls://, several for a cluster (a "
        "list, or joined by commas, as NATS_URL can carry them); redis: one redis://, "
        "rediss:// or, for a Redis Cluster, redis+cluster://host:port[,host:port...], for a "
        "primary under Sentinel, redis+sentinel://host:port[,host:port...]/service[/db]; "
        "postgres: one postgresql://, empty for the application's database; memory: none.",
    )
    replicas: Annotated[int, Field(ge=1, le=5)] = Field(
        default=1,
        description="Copies of the events stream in a NATS cluster (Jobs and Listeners say "
        "their own streams' copies).",
    )

    @field_validator("driver")
    @classmethod
    def known_driver(cls, driver: str) -> str:
        if driver not in BUILT_IN_DRIVERS:
            from importlib.metadata import entry_points

            added = {point.name for point in entry_points(group=DRIVERS_ENTRY_POINT_GROUP)}
            if driver not in added:
                known = ", ".join(sorted({*BUILT_IN_DRIVERS, *added}))
                raise ValueError(f"unknown driver {driver!r} (known: {known})")
        return driver

    @field_validator("url")
    @classmethod
    def driver_url(cls, url: str | list[str], info: ValidationInfo) -> str:
        driver = info.data.get("driver")
        urls = [part.strip() for part in url.split(",")] if isinstance(url, str) else url
        if driver is None:  # the driver's own error is the one to read
            return ",".join(urls)
        return check_bus_urls(driver, urls)


class DatabaseSpec(Model):
    url: Annotated[str | None, Shown(env="DATABASE_URL")] = Field(
        default=None,
        description="The SQL database (users, sessions, the outbox), as an SQLAlchemy URL; "
        "None: SQLite in var/mega.db beside the config file.",
    )


class ServicesSpec(Model):
    caches: dict[str, CacheSpec] = Field(
        default={}, description="Redis servers by alias, for the schedules' locks and tick audit."
    )
    locks: dict[str, LockSpec] = Field(
        default={}, description="Locks by alias, the name a Schedule's `lock` gives."
    )
    buses: dict[str, BusSpec] = Field(
        default={}, description="Buses by alias, the name a Job's or an Event's `bus` gives."
    )
    database: DatabaseSpec = Field(default=DatabaseSpec(), description="The SQL database.")
