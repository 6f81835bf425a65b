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
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)

from mega.constants import (
    DEV_ENV_FILE,
    DEV_ENV_NAMES,
    DEV_SECRET_KEY,
    MIN_SECRET_KEY_LENGTH,
    VAR_DIR,
)
from mega.errors import ConfigError
from mega.settings import (
    AuthConfig,
    BusSpec,
    DatabaseSpec,
    MetricsConfig,
    Model,
    OutboxConfig,
    ServicesSpec,
    Shown,
    WorkConfig,
)

logger = logging.getLogger("mega.config")


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


class ConfigFile(Model):
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
    """Import the config file and validate it.

    While `mega dev` runs beside the config, it leaves the URLs of its servers in
    `var/dev.env`: a host started by hand there finds them (unless NATS_URL / REDIS_URL are
    set), instead of talking to whatever answers on the default ports.

    Args:
        path: the config file (default: MEGA_CONFIG, else ./mega_config.py); ConfigError
            when it is not a file.
        dev: whether the process runs in dev, where a short or missing MEGA_SECRET_KEY will
            do; None (the default): MEGA_ENV == "dev".
        signs: whether the process signs cookies (the web app), so that it needs
            MEGA_SECRET_KEY outside dev; the other hosts sign nothing and do without.
    """
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
        # Compiled from its source at each load, never from cached bytecode: Python's cache
        # tells a changed file by its size and its time in whole seconds, so a config written
        # again within a second at the same size (by a test, by a tool) would load as it was.
        code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # the config file runs as its import would run it
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
