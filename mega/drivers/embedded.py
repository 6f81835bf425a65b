"""What every embedded server shares: a process on a free local port, started and stopped.

`mega dev` and the test suite run real servers so that a fresh laptop needs nothing but `pip`;
each driver brings its own (mega/drivers/<driver>/embedded.py) on top of `EmbeddedServer`.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mega.errors import MegaError

STARTUP_TIMEOUT_S = 10.0
# The ports free_port chooses among: below the range Linux (32768-60999), macOS and Windows
# (49152-65535) give outgoing connections, so no client socket takes one before its server binds.
LISTEN_PORTS = range(20000, 32768)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds right now, one of LISTEN_PORTS.

    Not the kernel's pick (a bind to port 0): that comes from the range the kernel also gives
    outgoing connections, and any client socket (a test's Redis connection, a browser's) could
    take it between this choice and the server's own bind, which then fails on a busy machine."""
    for _ in range(200):
        port = random.choice(LISTEN_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise MegaError(  # pragma: no cover - 200 ports in use in a row
        f"no free port on 127.0.0.1 between {LISTEN_PORTS.start} and {LISTEN_PORTS.stop - 1}; "
        "stop the servers left running (mega dev's, a test run's) and try again",
        code="embedded.no_free_port",
    )


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


@dataclass
class EmbeddedServer:
    """One server process; `start()` blocks until its port accepts connections."""

    name: ClassVar[str] = "server"
    startup_timeout_s: ClassVar[float] = STARTUP_TIMEOUT_S
    data_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    def prepare(self) -> dict[str, Any]:
        """Work before the process starts; returns extra `subprocess.Popen` options."""
        return {}

    def ready(self) -> bool:
        """The started process serves: by default, its port accepts connections."""
        return port_open(self.port)

    def start(self) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        options = self.prepare()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
            **options,
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited at start (code {self.process.returncode}); "
                    f"see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.name} did not accept connections on port {self.port} within "
                    f"{self.startup_timeout_s:.0f} s; see {self.log_path}"
                )
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
