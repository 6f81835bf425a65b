"""`mega work`: schedules, the outbox relay, listener groups and jobs in one real process, and
SIGTERM stopping them in that order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mega import JobQueue, outbox
from mega.config import load_config
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.events.test_events_faults import classes, runs
from tests.mega.jobs import fault_jobs
from tests.mega.jobs.test_jobs_faults import for_prefix

ROOT = Path(__file__).resolve().parents[3]
BODY = """
from tests.app.cluster_schedules import EverySecond
from tests.mega.events.fault_events import GroupA, Happened
from tests.mega.jobs.fault_jobs import BusyJob
schedules = [EverySecond]
jobs = [BusyJob]
events = [Happened]
listeners = [GroupA]
outbox = {"poll_s": 0.1}
"""


async def test_work_runs_everything_and_stops_in_order(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=BODY)
    env = {**os.environ, "FAULT_PREFIX": prefix, "CLUSTER_PREFIX": prefix}
    work = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mega",
            "work",
            "--with-scheduler",
            "--json-logs",
            "--config",
            str(path),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ctx = await boot(load_config(path), role="test")
    try:
        redis = ctx.cache("main").native
        deadline = time.monotonic() + 30
        while not await redis.hlen(f"{prefix}:runs"):  # a tick ran: the process is up
            assert time.monotonic() < deadline and work.poll() is None, "no tick"
            await asyncio.sleep(0.1)
        job = for_prefix(fault_jobs.BusyJob, prefix)
        await JobQueue(ctx, "jobs").enqueue(job, {"id": "j1"})
        event = classes(prefix)["event"]
        event_id = await ctx.db.run(lambda session: outbox.add(session, event, {"n": 1}))
        while not (await redis.hget(f"{prefix}:done", "j1") and (await runs(redis, prefix, "a"))):
            assert time.monotonic() < deadline, "the job or the event did not run"
            await asyncio.sleep(0.1)
        assert await runs(redis, prefix, "a") == {event_id: 1}
    finally:
        await shutdown(ctx)
        work.send_signal(signal.SIGTERM)
        output, _ = work.communicate(timeout=60)
    assert work.returncode == 0, output
    messages = [json.loads(line)["message"] for line in output.splitlines()]
    stops = [m for m in messages if m.endswith(" stopped")]
    assert stops == [
        "scheduler stopped",
        "relay stopped",
        "listeners stopped",
        "worker stopped",
        "work stopped",
    ]
    assert any("work" in m and "running 1 schedule(s)" in m for m in messages)
