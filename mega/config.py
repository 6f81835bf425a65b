"""Load and validate the application's config file (plain Python, e.g. ./mega_config.py).

The file declares services, schedules, jobs, workers, auth and metrics options as module-level
names. Everything is checked here, at boot, and a mistake raises ConfigError naming the key.

Environment overrides (documented in the README): a cache alias `main` takes its URL from
`REDIS_MAIN_URL` when set, a bus alias `jobs` from `NATS_JOBS_URL`; the config file itself
usually defaults its URLs to `REDIS_URL` / `NATS_URL`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from mega.constants import DEV_SECRET_KEY, MIN_SECRET_KEY_LENGTH
from mega.errors import ConfigError

CACHE_DRIVERS = {"redis"}
LOCK_DRIVERS = {"redlock"}
BUS_DRIVERS = {"nats"}


@dataclass(frozen=True)
class AuthConfig:
    """Login options. Windows and limits are per username and per client IP."""

    secret_key: str
    session_max_age_s: int = 8 * 3600
    login_max_failures: int = 5
    login_window_s: int = 15 * 60
    demo_user: str | None = None
    demo_password: str | None = None


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = False
    scheduler_port: int = 9101
    worker_port: int = 9102


@dataclass(frozen=True)
class Config:
    path: Path
    root: Path
    caches: dict[str, str]  # alias -> redis URL
    locks: dict[str, list[str]]  # alias -> cache aliases (one = single Redis, several = quorum)
    buses: dict[str, str]  # alias -> NATS URL
    database_url: str
    auth: AuthConfig
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    schedules: list[type] = field(default_factory=list)
    jobs: list[type] = field(default_factory=list)
    workers: list[type] = field(default_factory=list)
    web_app: str | None = None  # "module:factory" building the FastAPI app from a Context
    # Called once per host after registration, as hook(runtime, ctx): attach observers there.
    hooks: dict[str, list[Any]] = field(default_factory=dict)
    dev: bool = False
    module: ModuleType | None = None


def default_config_path() -> Path:
    return Path(os.environ.get("MEGA_CONFIG", "mega_config.py"))


def load_config(path: str | Path | None = None, *, dev: bool | None = None) -> Config:
    """Import the config file and validate it. `dev` defaults to MEGA_ENV == "dev"."""
    config_path = Path(path) if path is not None else default_config_path()
    if not config_path.is_file():
        raise ConfigError(f"config file not found: {config_path} (pass --config or MEGA_CONFIG)")
    config_path = config_path.resolve()
    module = _import_file(config_path)
    is_dev = os.environ.get("MEGA_ENV", "") == "dev" if dev is None else dev
    return build_config(module, config_path, dev=is_dev)


def build_config(module: ModuleType, path: Path, *, dev: bool) -> Config:
    services = _get(module, "services", dict, {})
    caches = _caches(services.get("caches", {}))
    return Config(
        path=path,
        root=path.parent,
        caches=caches,
        locks=_locks(services.get("locks", {}), caches),
        buses=_buses(services.get("buses", {})),
        database_url=_database_url(services.get("database", {}), path.parent),
        auth=_auth(_get(module, "auth", dict, {}), dev=dev),
        metrics=_metrics(_get(module, "metrics", dict, {})),
        schedules=list(_get(module, "schedules", list, [])),
        jobs=list(_get(module, "jobs", list, [])),
        workers=list(_get(module, "workers", list, [])),
        web_app=_get(module, "web_app", str, None),
        hooks=_hooks(_get(module, "hooks", dict, {})),
        dev=dev,
        module=module,
    )


def _import_file(path: Path) -> ModuleType:
    # The config imports the application (`from app...`): its folder must be importable.
    root = str(path.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location("mega_config", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import config file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mega_config"] = module
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"config file {path} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _get(module: ModuleType, name: str, kind: type, default: Any) -> Any:
    value = getattr(module, name, default)
    if value is not default and not isinstance(value, kind):
        raise ConfigError(f"{name}: expected a {kind.__name__}, got {type(value).__name__}")
    return value


def _driver(key: str, spec: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ConfigError(f"{key}: expected a dict like {{'driver': ..., ...}}")
    driver = spec.get("driver")
    if driver not in allowed:
        raise ConfigError(f"{key}.driver: unknown driver {driver!r} (known: {sorted(allowed)})")
    return spec


def _url(key: str, url: Any, schemes: set[str]) -> str:
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{key}: a URL is required")
    parts = urlsplit(url)
    if parts.scheme not in schemes or not parts.hostname:
        raise ConfigError(
            f"{key}: bad URL {url!r} (expected {'/'.join(sorted(schemes))}://host:port)"
        )
    return url


def _env_override(prefix: str, alias: str) -> str | None:
    return os.environ.get(f"{prefix}_{alias.upper()}_URL")


def _caches(spec: dict[str, Any]) -> dict[str, str]:
    caches = {}
    for alias, item in spec.items():
        key = f"services.caches.{alias}"
        item = _driver(key, item, CACHE_DRIVERS)
        url = _env_override("REDIS", alias) or item.get("url")
        caches[alias] = _url(f"{key}.url", url, {"redis", "rediss", "unix"})
    return caches


def _locks(spec: dict[str, Any], caches: dict[str, str]) -> dict[str, list[str]]:
    locks = {}
    for alias, item in spec.items():
        key = f"services.locks.{alias}"
        item = _driver(key, item, LOCK_DRIVERS)
        names = item.get("caches", [item["cache"]] if "cache" in item else None)
        if not names or not isinstance(names, list):
            raise ConfigError(f"{key}.caches: list the cache aliases the lock uses")
        for name in names:
            if name not in caches:
                raise ConfigError(f"{key}.caches: {name!r} names no cache in services.caches")
        locks[alias] = list(names)
    return locks


def _buses(spec: dict[str, Any]) -> dict[str, str]:
    buses = {}
    for alias, item in spec.items():
        key = f"services.buses.{alias}"
        item = _driver(key, item, BUS_DRIVERS)
        url = _env_override("NATS", alias) or item.get("url")
        buses[alias] = _url(f"{key}.url", url, {"nats", "tls"})
    return buses


def _database_url(spec: dict[str, Any], root: Path) -> str:
    url = (
        os.environ.get("DATABASE_URL") or spec.get("url") or f"sqlite:///{root / 'var' / 'mega.db'}"
    )
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"services.database.url: bad URL {url!r}")
    return url


def _auth(spec: dict[str, Any], *, dev: bool) -> AuthConfig:
    secret = os.environ.get("MEGA_SECRET_KEY") or spec.get("secret_key")
    if not secret:
        if not dev:
            raise ConfigError("MEGA_SECRET_KEY: required outside dev (a long random string)")
        secret = DEV_SECRET_KEY
    elif len(secret) < MIN_SECRET_KEY_LENGTH and not dev:
        raise ConfigError(f"MEGA_SECRET_KEY: use at least {MIN_SECRET_KEY_LENGTH} characters")
    user = os.environ.get("MEGA_DEMO_USER") or spec.get("demo_user")
    password = os.environ.get("MEGA_DEMO_PASSWORD") or spec.get("demo_password")
    if dev:  # only `mega dev` has a default login; elsewhere users are created explicitly
        user, password = user or "demo", password or "demo"
    options = {
        k: spec[k]
        for k in ("session_max_age_s", "login_max_failures", "login_window_s")
        if k in spec
    }
    for name, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"auth.{name}: expected a positive int, got {value!r}")
    return AuthConfig(secret_key=secret, demo_user=user, demo_password=password, **options)


HOOK_HOSTS = {"scheduler", "worker", "web"}


def _hooks(spec: dict[str, Any]) -> dict[str, list[Any]]:
    unknown = set(spec) - HOOK_HOSTS
    if unknown:
        raise ConfigError(f"hooks: unknown hosts {sorted(unknown)} (known: {sorted(HOOK_HOSTS)})")
    for host, hooks in spec.items():
        if not isinstance(hooks, list) or not all(callable(hook) for hook in hooks):
            raise ConfigError(f"hooks.{host}: expected a list of callables hook(runtime, ctx)")
    return {host: list(hooks) for host, hooks in spec.items()}


def _metrics(spec: dict[str, Any]) -> MetricsConfig:
    allowed = {"enabled", "scheduler_port", "worker_port"}
    unknown = set(spec) - allowed
    if unknown:
        raise ConfigError(f"metrics: unknown keys {sorted(unknown)} (known: {sorted(allowed)})")
    return MetricsConfig(**spec)
