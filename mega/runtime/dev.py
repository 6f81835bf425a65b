"""`mega dev`: the whole system on a laptop, in one terminal.

1. Embedded nats-server (JetStream, file store under ./var/nats) and a Redis-compatible server,
   each on a free port, unless NATS_URL / REDIS_URL are already set; and when a bus is on
   PostgreSQL (`needs_postgres`) and DATABASE_URL is unset, an embedded PostgreSQL whose
   cluster lives under ./var/postgres (durable: kept from one run to the next).
2. `mega start`, two `mega scheduler` and two `mega worker` processes (`--schedulers N`,
   `--workers N`) as children, their output prefixed and coloured per process. Two of each,
   so that the per-tick lock visibly skips on one scheduler and the workers share the jobs.
3. The URL (with the config's `auth.landing_path`) and the logins of `auth.users`, once the
   web app answers /healthz.
   Their URLs go to var/dev.env while it runs: `mega scheduler` or `mega worker` started by hand
   beside the config finds them (and, signing nothing, needs no secret key).
4. A scheduler or worker that dies unexpectedly (a `crash` job ends its worker on purpose) is
   started again, up to RESTART_LIMIT times a minute each (a `crash` job ends one worker per
   attempt); one that keeps dying, or the web app dying, stops everything.
5. Ctrl-C (or SIGTERM): SIGTERM to every child, wait for their graceful drain, then stop the
   embedded servers. Nothing is left running.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from mega.config import Config, load_config
from mega.constants import DEV_ENV_FILE, DEV_ENV_NAMES, DRAIN_TIMEOUT_S, VAR_DIR
from mega.drivers.embedded import EmbeddedServer, free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.postgres.embedded import EmbeddedPostgres
from mega.drivers.redis.embedded import EmbeddedRedis
from mega.runtime.web_host import check_port_free

COLOURS = {
    "web": "36",
    "scheduler": "35",
    "worker": "33",
    "dev": "32",
}  # ANSI cyan/magenta/yellow/green
READY_TIMEOUT_S = 30.0
# A scheduler or worker that dies is restarted, at most this many times each in RESTART_WINDOW_S.
RESTART_LIMIT = 10
RESTART_WINDOW_S = 60.0


class Prefixer:
    """Copies a child's output to our stdout, each line prefixed `name |` in its colour."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        self.lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        label = f"{name:<{self.width}} |"
        if self.colour:
            colour = COLOURS.get(name.split("-")[0], "37")
            label = f"\033[{colour}m{label}\033[0m"
        with self.lock:
            sys.stdout.write(f"{label} {text}\n")
            sys.stdout.flush()

    def follow(self, name: str, stream: IO[bytes]) -> threading.Thread:
        def pump() -> None:
            for raw in iter(stream.readline, b""):
                self.line(name, raw.decode(errors="replace").rstrip())

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        return thread


def run_dev(
    config_path: str, *, host: str, port: int, schedulers: int = 2, workers: int = 2
) -> int:
    """Run everything until Ctrl-C; returns the exit code."""
    config_file = Path(config_path).resolve()
    root = config_file.parent
    out = Prefixer(width=11)
    servers: list[EmbeddedServer] = []
    children: dict[str, subprocess.Popen[bytes]] = {}
    dev_env: Path | None = None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    # A var/dev.env left by a dev run that was killed would point this one at dead servers.
    (root / VAR_DIR / DEV_ENV_FILE).unlink(missing_ok=True)
    # The config file may read MEGA_ENV too (the sample's default login exists only in dev).
    os.environ["MEGA_ENV"] = "dev"
    env = dict(os.environ, MEGA_CONFIG=str(config_file), PYTHONUNBUFFERED="1")
    env.setdefault("MEGA_METRICS_BIND", "127.0.0.1")  # the hosts' metrics: this laptop only
    try:
        check_port_free(host, port)
        # Before the config is loaded: it reads DATABASE_URL, which this server provides.
        postgres = start_dev_postgres(config_file, env)
        if postgres is not None:
            servers.append(postgres)
            os.environ["DATABASE_URL"] = env["DATABASE_URL"]
            out.line("dev", f"embedded PostgreSQL on {env['DATABASE_URL']}")
        config = load_config(config_file, dev=True)  # fail fast, before the hosts start
        if not env.get("NATS_URL"):
            servers.append(EmbeddedNats(data_dir=root / VAR_DIR / "nats").start())
            env["NATS_URL"] = servers[-1].url
            out.line("dev", f"embedded nats-server (JetStream) on {env['NATS_URL']}")
        if not env.get("REDIS_URL"):
            servers.append(EmbeddedRedis(data_dir=root / VAR_DIR / "redis").start())
            env["REDIS_URL"] = servers[-1].url
            out.line("dev", f"embedded Redis-compatible server on {env['REDIS_URL']}")
        dev_env = _write_dev_env(root, env) if servers else None
        _upgrade_database(out, config.database_url)
        commands = {"web": ["start", "--host", host, "--port", str(port)]}
        for role, count in (("scheduler", schedulers), ("worker", workers)):
            for n in range(1, count + 1):
                commands[f"{role}-{n}" if count > 1 else role] = [role]

        def spawn(name: str) -> subprocess.Popen[bytes]:
            # Each host its own free metrics port: several of them, and two checkouts side by
            # side (`make run PORT=...`).
            child_env, role = dict(env), commands[name][0]
            if role in ("scheduler", "worker"):
                child_env[f"MEGA_{role.upper()}_METRICS_PORT"] = str(free_port())
            child = subprocess.Popen(
                [sys.executable, "-m", "mega", *commands[name], "--config", str(config_file)],
                cwd=root,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
            )
            out.follow(name, child.stdout)  # type: ignore[arg-type]
            hint = "" if name == "web" else f" (`kill {child.pid}` to watch it come back)"
            out.line("dev", f"{name} started, pid {child.pid}{hint}")
            return child

        for name in commands:
            children[name] = spawn(name)
        code = _supervise(config, out, children, stop, host, port, spawn)
    except Exception as exc:
        out.line("dev", f"error: {getattr(exc, 'message', exc)}")
        code = 1
    finally:
        _stop_children(out, children)
        if dev_env is not None:
            dev_env.unlink(missing_ok=True)
        for server in reversed(servers):
            server.stop()
        if servers:
            out.line("dev", "embedded servers stopped")
    return code


def needs_postgres(services: object, environ: Mapping[str, str]) -> bool:
    """A bus on PostgreSQL: a bus of the config file's `services["buses"]` whose driver is
    "postgres", or MEGA_BUS=postgres (the sample's config picks its bus by it)."""
    if environ.get("MEGA_BUS") == "postgres":
        return True
    buses = services.get("buses") if isinstance(services, dict) else None
    if not isinstance(buses, dict):
        return False
    return any(isinstance(bus, dict) and bus.get("driver") == "postgres" for bus in buses.values())


def start_dev_postgres(config_file: Path, env: dict[str, str]) -> EmbeddedPostgres | None:
    """An embedded PostgreSQL under <config folder>/var/postgres when a bus needs one and
    DATABASE_URL is unset; sets env["DATABASE_URL"] to it. None when nothing was started."""
    if env.get("DATABASE_URL"):
        return None
    if not needs_postgres(None, env) and not needs_postgres(_config_services(config_file), env):
        return None
    server = EmbeddedPostgres(data_dir=config_file.parent / VAR_DIR / "postgres").start()
    env["DATABASE_URL"] = server.url
    return server


def _config_services(config_file: Path) -> object:
    """The config file's `services` as written, before any validation (which may not know
    every driver): None when it does not import (load_config then says why)."""
    root = str(config_file.parent)
    if root not in sys.path:
        sys.path.insert(0, root)  # the config imports its application
    spec = importlib.util.spec_from_file_location("_mega_config_probe", config_file)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    with contextlib.suppress(Exception):
        spec.loader.exec_module(module)
        return getattr(module, "services", None)
    return None


def _supervise(
    config: Config,
    out: Prefixer,
    children: dict[str, subprocess.Popen[bytes]],
    stop: threading.Event,
    host: str,
    port: int,
    spawn: Callable[[str], subprocess.Popen[bytes]],
) -> int:
    shown_host = "localhost" if host in ("127.0.0.1", "0.0.0.0") else host
    url = f"http://{shown_host}:{port}"
    announced = False
    deadline = time.monotonic() + READY_TIMEOUT_S
    restarts: dict[str, list[float]] = {}
    while not stop.wait(0.2):
        for name, child in list(children.items()):
            if child.poll() is None:
                continue
            now = time.monotonic()
            recent = [at for at in restarts.get(name, []) if now - at < RESTART_WINDOW_S]
            if name == "web" or len(recent) >= RESTART_LIMIT:
                why = "the web app" if name == "web" else f"{len(recent)} restarts in a minute"
                out.line("dev", f"{name} exited with code {child.returncode} ({why}); stopping")
                return 1
            restarts[name] = [*recent, now]
            out.line("dev", f"{name} exited with code {child.returncode}; starting it again")
            children[name] = spawn(name)
        if not announced and _healthy(f"http://127.0.0.1:{port}/healthz"):
            announced = True
            out.line("dev", "")
            out.line("dev", f"  mega-py is running: {url}{config.auth.landing_path}")
            for user, password in config.auth.users.items():
                out.line("dev", f"  log in as {user} / {password}")
            out.line("dev", "  Ctrl-C stops everything")
            out.line("dev", "")
        elif not announced and time.monotonic() > deadline:
            out.line("dev", f"web did not answer on {url}/healthz within {READY_TIMEOUT_S:.0f} s")
            deadline = float("inf")
    out.line("dev", "stopping: web, schedulers and workers drain their work")
    return 0


def _write_dev_env(root: Path, env: dict[str, str]) -> Path:
    """The embedded servers' URLs in var/dev.env, so that `mega scheduler` or `mega worker`
    started by hand in another terminal joins this stack (`load_config` reads it)."""
    path = root / VAR_DIR / DEV_ENV_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name}={env[name]}\n" for name in DEV_ENV_NAMES if env.get(name)))
    return path


def _upgrade_database(out: Prefixer, url: str) -> None:
    """`mega db upgrade`, before the hosts start."""
    from mega.database import Database
    from mega.runtime.migrate import upgrade

    db = Database(url)
    try:
        before, after = upgrade(db)
        change = "at" if before == after else f"upgraded from {before or 'empty'} to"
        out.line("dev", f"database {db.redacted_url}: {change} {after}")
    finally:
        db.dispose()


def _stop_children(out: Prefixer, children: dict[str, subprocess.Popen[bytes]]) -> None:
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S + 5
    for name, child in children.items():
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            out.line("dev", f"{name} did not stop in time; killing it")
            child.kill()
            child.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return bool(response.status == 200)
    except OSError:
        return False
