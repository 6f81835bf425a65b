"""A host stopped while NATS does not answer (its process frozen, as a hung node or a network
that drops packets is): it still exits 0 within its drain budget and logs no error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mega.constants import DRAIN_TIMEOUT_S
from tests.factories import sample_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
# docker-compose.yml gives the scheduler and the worker this long after SIGTERM, then SIGKILLs.
STOP_GRACE_S = 45
STARTED = {"worker": "consuming 7 job(s)", "scheduler": "running 1 schedule(s)"}


@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_a_host_stopped_while_nats_does_not_answer_exits_0_quietly(
    tmp_path: Path, nats_factory: Callable[[], Any], redis_factory: Callable[[], Any], command: str
) -> None:
    assert DRAIN_TIMEOUT_S < STOP_GRACE_S
    nats = nats_factory()
    path = sample_config(tmp_path, nats_url=nats.url, redis_url=redis_factory().url)
    log = tmp_path / f"{command}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mega", command, "--config", str(path)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while STARTED[command] not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        os.kill(nats.process.pid, signal.SIGSTOP)
        process.send_signal(signal.SIGTERM)
        code = process.wait(STOP_GRACE_S)
    finally:
        os.kill(nats.process.pid, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert code == 0, output
    assert f"{command} stopped" in output.splitlines()[-1], output
    assert " ERROR " not in output and "Traceback" not in output, output
