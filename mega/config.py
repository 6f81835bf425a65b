"""Load and validate the application's config file (plain Python, e.g. ./mega_config.py).

The file declares services, schedules, jobs, workers, auth and metrics options as module-level
names. Everything is validated here, at boot, by the pydantic models below, and every mistake is
reported at once in one ConfigError whose lines name the key (`services.buses.jobs.url: ...`).

Environment overrides (documented in the README): a cache alias `main` takes its URL from
`REDIS_MAIN_URL` when set, a bus alias `jobs` from `NATS_JOBS_URL`; the config file itself
usually defaults its URLs to `REDIS_URL` / `NATS_URL`. `DATABASE_URL` and `MEGA_SECRET_KEY`
win over the file.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mega.constants import (
    BUILT_IN_DRIVERS,
    DEV_ENV_FILE,
    DEV_ENV_NAMES,
    DEV_SECRET_KEY,
    DRIVERS_ENTRY_POINT_GROUP,
    MIN_SECRET_KEY_LENGTH,
    VAR_DIR,
)
from mega.errors import ConfigError

logger = logging.getLogger("mega.config")

PositiveInt = Annotated[StrictInt, Field(gt=0)]
Port = Annotated[StrictInt, Field(gt=0, lt=65536)]


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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Shown:
    """What the config reference (`mega.runtime.config_reference`) says of a key beyond its
    annotation: `type` where the annotation is too loose to read (`list[type]`), `env` the
    variable that replaces the key's value when set (`build_config` reads it)."""

    type: str = ""
    env: str = ""


class CacheSpec(_Model):
    driver: Literal["redis"] = Field(description="The cache's engine; only Redis for now.")
    url: Annotated[str, AfterValidator(check_redis_url), Shown(env="REDIS_<ALIAS>_URL")] = Field(
        description="Where the Redis server is: redis://, rediss:// (TLS) or unix://; a Redis "
        "Cluster: redis+cluster://host:port[,host:port...] (rediss+cluster:// over TLS); a "
        "primary under Sentinel: redis+sentinel://host:port[,host:port...]/service[/db], the "
        "sentinels' addresses and the name they monitor it by (rediss+sentinel:// over TLS)."
    )


class LockSpec(_Model):
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


class BusSpec(_Model):
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


class DatabaseSpec(_Model):
    url: Annotated[str | None, Shown(env="DATABASE_URL")] = Field(
        default=None,
        description="The SQL database (users, sessions, the outbox), as an SQLAlchemy URL; "
        "None: SQLite in var/mega.db beside the config file.",
    )


class ServicesSpec(_Model):
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


# A console user's access, lowest first: each level may do what the ones before it may.
Role = Literal["viewer", "operator", "admin"]


class AuthConfig(_Model):
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


class MetricsConfig(_Model):
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


class OutboxConfig(_Model):
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


class WorkConfig(_Model):
    """`mega work`: what the single process runs beyond jobs, listeners and the relay."""

    scheduler: StrictBool = Field(
        default=False, description="Also tick the schedules in `mega work` (as --with-scheduler)."
    )


def _classes(kind: str) -> Shown:
    return Shown(type=f"list of {kind} classes")


def middleware_problem(middleware: object) -> str | None:
    """Why `middleware` cannot be a run's middleware (a sentence naming the fix), or None."""
    if isinstance(middleware, type):
        name = middleware.__name__
        return f"{name} is a class: list an instance of it, {name}()"
    call = middleware if inspect.isfunction(middleware) else getattr(middleware, "__call__", None)  # noqa: B004
    if call is None or not inspect.iscoroutinefunction(call):
        return (
            f"{middleware!r} is not a middleware: give an object with "
            "`async def __call__(self, run, call_next)`, or an `async def f(run, call_next)`"
        )
    try:
        inspect.signature(call).bind(None, None)
    except TypeError:
        return f"{middleware!r} must take two arguments: (run, call_next)"
    return None


class ConfigFile(_Model):
    """The module-level names of a config file, as the loader reads them, in the order the
    config reference lists them."""

    model_config = ConfigDict(extra="ignore", frozen=True, arbitrary_types_allowed=True)

    services: ServicesSpec = Field(
        default=ServicesSpec(), description="The engines the hosts connect to, each by an alias."
    )
    auth: AuthConfig = Field(description="Login and session options.")
    metrics: MetricsConfig = Field(default=MetricsConfig(), description="Prometheus metrics.")
    outbox: OutboxConfig = Field(
        default=OutboxConfig(), description="The outbox relay that publishes committed events."
    )
    work: WorkConfig = Field(
        default=WorkConfig(),
        description="What `mega work` runs beyond jobs, listeners and the relay.",
    )
    web_app: Annotated[str, Field(pattern=r"^[\w.]+(:\w+)?$")] | None = Field(
        default=None,
        description='"module:factory" whose factory(config, ctx) builds the FastAPI app; None: '
        "the framework's bare app.",
    )
    hooks: Annotated[
        dict[Literal["scheduler", "worker", "web", "listeners", "relay"], list[Callable[..., Any]]],
        Shown(type="host -> list of functions"),
    ] = Field(
        default={},
        description="Functions called once per host after registration, as hook(runtime, ctx) "
        "(async or not), to attach observers; hosts: scheduler, worker, web, listeners, relay.",
    )
    schedules: Annotated[list[type], _classes("Schedule")] = Field(
        default=[], description="The schedules `mega scheduler` ticks."
    )
    jobs: Annotated[list[type], _classes("Job")] = Field(
        default=[], description="The jobs `mega worker` consumes and the web app may enqueue."
    )
    workers: Annotated[list[type], _classes("Worker")] = Field(
        default=[], description="The CPU pools the web app starts (`ctx.workers`)."
    )
    events: Annotated[list[type], _classes("Event")] = Field(
        default=[], description="The events the outbox may carry; declaring any starts the relay."
    )
    listeners: Annotated[list[type], _classes("Listener")] = Field(
        default=[], description="The listener groups `mega worker` runs."
    )
    middlewares: Annotated[list[Any], Shown(type="list of middlewares")] = Field(
        default=[],
        description="What every job's and listener's run goes through, the first outermost: "
        "objects with `async def __call__(self, run, call_next)`.",
    )

    @field_validator("middlewares")
    @classmethod
    def _middlewares(cls, middlewares: list[Any]) -> list[Any]:
        for index, middleware in enumerate(middlewares):
            problem = middleware_problem(middleware)
            if problem is not None:
                raise ValueError(f"item {index}: {problem}")
        return middlewares

    apply_limits: StrictBool = Field(
        default=False,
        description="Let a worker change a running consumer's limits to its classes' (as "
        "--apply-limits).",
    )


@dataclass(frozen=True)
class Config:
    path: Path
    root: Path
    caches: dict[str, str]  # alias -> redis URL
    locks: dict[str, list[str]]  # alias -> cache aliases (one = single Redis, several = quorum)
    buses: dict[str, BusSpec]  # alias -> its driver, URL and replicas
    database_url: str
    auth: AuthConfig
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    schedules: list[type] = field(default_factory=list)
    jobs: list[type] = field(default_factory=list)
    workers: list[type] = field(default_factory=list)
    events: list[type] = field(default_factory=list)
    listeners: list[type] = field(default_factory=list)
    middlewares: list[Any] = field(default_factory=list)  # see ConfigFile.middlewares
    outbox: OutboxConfig = field(default_factory=OutboxConfig)
    work: WorkConfig = field(default_factory=WorkConfig)
    apply_limits: bool = False  # see ConfigFile.apply_limits
    web_app: str | None = None  # "module:factory" building the FastAPI app from a Context
    # Called once per host after registration, as hook(runtime, ctx): attach observers there.
    hooks: dict[str, list[Any]] = field(default_factory=dict)
    dev: bool = False
    module: ModuleType | None = None


def default_config_path() -> Path:
    return Path(os.environ.get("MEGA_CONFIG", "mega_config.py"))


def load_config(
    path: str | Path | None = None, *, dev: bool | None = None, signs: bool = True
) -> Config:
    """Import the config file and validate it. `dev` defaults to MEGA_ENV == "dev". `signs`:
    the process signs cookies (the web app), so it needs MEGA_SECRET_KEY outside dev; the
    other hosts sign nothing and do without.

    While `mega dev` runs beside the config, it leaves the URLs of its servers in
    `var/dev.env`: a host started by hand there finds them (unless NATS_URL / REDIS_URL are
    set), instead of talking to whatever answers on the default ports."""
    config_path = Path(path) if path is not None else default_config_path()
    if not config_path.is_file():
        raise ConfigError(f"config file not found: {config_path} (pass --config or MEGA_CONFIG)")
    config_path = config_path.resolve()
    _read_dev_env(config_path.parent / VAR_DIR / DEV_ENV_FILE)
    module = _import_file(config_path)
    is_dev = os.environ.get("MEGA_ENV", "") == "dev" if dev is None else dev
    return build_config(module, config_path, dev=is_dev, signs=signs)


def _read_dev_env(path: Path) -> None:
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        if name in DEV_ENV_NAMES and value and not os.environ.get(name):
            os.environ[name] = value
            logger.info("%s from %s (mega dev is running there)", name, path)


def build_config(module: ModuleType, path: Path, *, dev: bool, signs: bool = True) -> Config:
    names = {
        name: getattr(module, name) for name in ConfigFile.model_fields if hasattr(module, name)
    }
    try:
        names = _with_env_overrides(names)
        for variable, key in (("MEGA_METRICS_BIND", "bind"), ("MEGA_METRICS_TOKEN", "token")):
            if os.environ.get(variable) and isinstance(names.get("metrics", {}), dict):
                names["metrics"] = {**names.get("metrics", {}), key: os.environ[variable]}
        names["auth"] = _with_secret(names.get("auth", {}), dev=dev, signs=signs)
        spec = ConfigFile.model_validate(names)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    services = spec.services
    for alias, lock in services.locks.items():
        for name in lock.cache_aliases:
            if name not in services.caches:
                raise ConfigError(
                    f"services.locks.{alias}.caches: {name!r} names no cache in services.caches"
                )
    return Config(
        path=path,
        root=path.parent,
        caches={alias: cache.url for alias, cache in services.caches.items()},
        locks={alias: lock.cache_aliases for alias, lock in services.locks.items()},
        buses=dict(services.buses),
        database_url=_database_url(services.database, path.parent),
        auth=spec.auth,
        metrics=spec.metrics,
        schedules=list(spec.schedules),
        jobs=list(spec.jobs),
        workers=list(spec.workers),
        events=list(spec.events),
        listeners=list(spec.listeners),
        middlewares=list(spec.middlewares),
        outbox=spec.outbox,
        work=spec.work,
        apply_limits=spec.apply_limits,
        web_app=spec.web_app,
        hooks={host: list(hooks) for host, hooks in spec.hooks.items()},
        dev=dev,
        module=module,
    )


# Set on every module imported as a config: such a module may be replaced by a config of the
# same name loaded later; any other module of that name is left alone.
CONFIG_MARK = "__mega_config__"


def _import_file(path: Path) -> ModuleType:
    # The config imports the application (`from app...`): its folder must be importable.
    root = str(path.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import config file {path}")
    module = importlib.util.module_from_spec(spec)
    setattr(module, CONFIG_MARK, True)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"config file {path} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _module_name(path: Path) -> str:
    """The config's own module name, its file's (`mega_config`, `staging_config`): so a config
    can `from mega_config import services` to build on another, and two live side by side. A
    name already taken by a module that is not a config (`app.py` as a config, beside the `app`
    package) gets a prefix instead of replacing it."""
    name = path.stem if path.stem.isidentifier() else "mega_config"
    held = sys.modules.get(name)
    if held is None or getattr(held, CONFIG_MARK, False):
        return name
    if Path(getattr(held, "__file__", None) or "").resolve() == path.resolve():
        return name
    return f"mega_config_{name}"


def _with_env_overrides(names: dict[str, Any]) -> dict[str, Any]:
    """REDIS_<ALIAS>_URL and NATS_<ALIAS>_URL replace a declared alias's URL."""
    services = names.get("services")
    if not isinstance(services, dict):
        return names
    services = dict(services)
    for section, prefix in (("caches", "REDIS"), ("buses", "NATS")):
        declared = services.get(section)
        if not isinstance(declared, dict):
            continue
        services[section] = {
            alias: _override(item, os.environ.get(f"{prefix}_{str(alias).upper()}_URL"))
            for alias, item in declared.items()
        }
    return {**names, "services": services}


def _override(item: Any, url: str | None) -> Any:
    return {**item, "url": url} if url and isinstance(item, dict) else item


def _describe(exc: ValidationError) -> str:
    """One line per problem, each naming its key: `services.buses.jobs.url: bad URL ...`."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"] if not str(part).startswith("function-")]
        key = ".".join(loc) or "config"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "literal_error" and loc and loc[-1] == "driver":
            message = f"unknown driver {error['input']!r} ({message.lower()})"
        elif error["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"{key}: {message}")
    return "; ".join(lines)


def _database_url(spec: DatabaseSpec, root: Path) -> str:
    url = os.environ.get("DATABASE_URL") or spec.url or f"sqlite:///{root / 'var' / 'mega.db'}"
    if "://" not in url:
        raise ConfigError(f"services.database.url: bad URL {url!r}")
    return url


def _with_secret(auth: Any, *, dev: bool, signs: bool = True) -> Any:
    """MEGA_SECRET_KEY over the file's; only `mega dev` may go without (a fixed dev key), and
    the hosts that sign nothing (a throwaway key they never use)."""
    if not isinstance(auth, dict):
        return auth  # pydantic names the mistake
    secret = os.environ.get("MEGA_SECRET_KEY") or auth.get("secret_key")
    if not secret and not signs:
        return {**auth, "secret_key": secrets.token_hex(32)}
    if not secret:
        if not dev:
            raise ConfigError("MEGA_SECRET_KEY: required outside dev (a long random string)")
        secret = DEV_SECRET_KEY
    elif isinstance(secret, str) and len(secret) < MIN_SECRET_KEY_LENGTH and not dev:
        raise ConfigError(f"MEGA_SECRET_KEY: use at least {MIN_SECRET_KEY_LENGTH} characters")
    return {**auth, "secret_key": secret}
