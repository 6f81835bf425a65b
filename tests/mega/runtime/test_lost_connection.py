"""A bus connection its server closed for good (nats-py ends a connection on any -ERR, never
to reconnect): readiness says so (503) and the host exits non-zero for its supervisor to start
it again, instead of running on with every consume loop stuck and its health green."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from mega.config import load_config
from mega.runtime.bootstrap import boot, shutdown
from mega.runtime.hosts import watch_buses
from mega.web.health import readiness
from tests.factories import write_config

ROOT = Path(__file__).resolve().parents[3]
# A subject longer than the server's control line (4 KB): it answers -ERR and closes.
REFUSED_SUBJECT = "x" * 6000


async def test_a_connection_closed_for_good_is_told_and_reads_down(
    tmp_path: Path, nats_url: str
) -> None:
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=None))
    ctx = await boot(config, role="test", database=False)
    told: list[str] = []
    try:
        watch_buses(ctx, told.append)
        assert await readiness(ctx) == {"nats:jobs": "ok"}
        await ctx.bus("jobs").native.publish(REFUSED_SUBJECT, b"")
        deadline = time.monotonic() + 15
        while not told:
            assert time.monotonic() < deadline, "the lost connection was never told"
            await asyncio.sleep(0.05)
        [why] = told
        assert why.startswith("bus 'jobs': ") and "control line" in why.lower()
        assert (await readiness(ctx))["nats:jobs"].startswith("down: ")
    finally:
        await shutdown(ctx)
    assert told == [why]  # our own close is no news


WORKER_BODY = """
import asyncio
from mega import Job


class Noop(Job):
    bus = "jobs"
    subject = "lost.noop"

    async def run(self, payload, ctx):
        return None


def refuse_later(runtime, ctx):
    native = ctx.bus("jobs").native
    asyncio.get_running_loop().call_later(
        1, lambda: asyncio.ensure_future(native.publish("x" * 6000, b""))
    )


jobs = [Noop]
hooks = {"worker": [refuse_later]}
"""


async def test_a_worker_whose_connection_is_closed_for_good_exits_non_zero(
    tmp_path: Path, nats_url: str
) -> None:
    path = write_config(tmp_path, nats_url=nats_url, redis_url=None, body=WORKER_BODY)
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "mega", "worker", "--config", str(path)],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        code = await asyncio.to_thread(worker.wait, 60)
    finally:
        if worker.poll() is None:
            worker.kill()
    text = log.read_text()
    assert code == 3, text  # the CLI's exit for a dependency
    assert "NATS connection closed for good" in text
    assert "worker stopped: its connection to bus 'jobs'" in text
    assert "closed for good, so worker stopped; started again" in text
