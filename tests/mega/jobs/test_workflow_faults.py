"""A group's callback runs once while its workers are SIGKILLed: 200 members on three `mega
worker` processes, one of them SIGKILLed (and a new one started) every second while the
members finish and another one consumes, on every driver whose jobs outlive a process (the
memory driver's live in one: its fan-in is proven in test_workflow.py). The callback ran once,
with 200 outcomes."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mega import JobQueue, group
from mega.config import load_config
from mega.context import Context
from mega.jobs.workflow_records import WORKFLOWS, outcome_key
from mega.runtime.bootstrap import boot, shutdown
from tests.factories import write_config
from tests.mega.jobs import fault_jobs
from tests.mega.jobs.test_contract import bus_body
from tests.mega.jobs.test_jobs_faults import MegaWorker, for_prefix
from tests.settled import settled

MEMBERS = 200
KILL_EVERY_S = 1.0
WORKERS = 3
IN_FLIGHT = 12  # members run at once across the workers: about 5 s of work for the 200
TIMEOUT_S = 90.0
JOBS = "from tests.mega.jobs.fault_jobs import FanIn, Member\njobs = [Member, FanIn]\n"


@pytest.fixture(params=["nats", "redis", "postgres"])
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, nats_url: str, redis_url: str
) -> AsyncIterator[tuple[Path, Context, JobQueue]]:
    body = bus_body(request) + JOBS
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    ctx = await boot(load_config(path), role="test", database=False)
    queue = JobQueue(ctx, "jobs")
    assert queue.bus.driver == request.param
    yield path, ctx, queue
    await shutdown(ctx)


def callback_lines(records: Path) -> list[str]:
    return [
        line.split()[2]
        for log in records.glob("*.log")
        for line in log.read_text().splitlines()
        if line.split()[1] == "callback"
    ]


async def members_ended(queue: JobQueue, workflow_id: str) -> int:
    keys = [outcome_key(workflow_id, n) for n in range(MEMBERS)]
    found = await queue.bus.get_records(WORKFLOWS, "status", keys)
    return sum(raw is not None for raw in found)


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_the_callback_runs_once_while_workers_are_sigkilled(
    setup: Any, tmp_path: Path, prefix: str
) -> None:
    config, ctx, queue = setup
    # A NATS lane's concurrency caps the fleet, the other drivers' each process.
    per_lane = IN_FLIGHT if queue.bus.driver == "nats" else IN_FLIGHT // WORKERS
    records = tmp_path / "records"
    records.mkdir()
    logs: list[MegaWorker] = []

    def start() -> MegaWorker:
        worker = MegaWorker(
            config,
            prefix,
            tmp_path / f"worker-{len(logs)}.log",
            env={"FAULT_RECORDS": str(records), "FAULT_MEMBER_CONCURRENCY": str(per_lane)},
        )
        logs.append(worker)
        return worker

    member = for_prefix(fault_jobs.Member, prefix)
    fan_in = for_prefix(fault_jobs.FanIn, prefix)
    try:
        running = [await start().ready() for _ in range(WORKERS)]
        fan = group([member.step({"n": n}) for n in range(MEMBERS)]).then(fan_in.step())
        workflow_id = await fan.enqueue(ctx)
        deadline = time.monotonic() + TIMEOUT_S
        kills = before = 0
        while (ended := await members_ended(queue, workflow_id)) < MEMBERS:
            assert time.monotonic() < deadline, f"{ended} of {MEMBERS} members ended"
            await asyncio.sleep(KILL_EVERY_S)
            now = await members_ended(queue, workflow_id)
            if now == before:
                continue  # none ended since the last kill (a loaded machine): let them start
            before = now
            ready = [w for w in running if " consuming " in w.output()]
            # Never the last one consuming: on a slow machine a worker takes seconds to start,
            # and killing each as it came up left none running for most of the run.
            if len(ready) >= 2 and now < MEMBERS:
                victim = ready[0]  # the oldest that runs members; a new one takes its place
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait()
                running.remove(victim)
                running.append(start())
                kills += 1
        status = None
        while status is None or not status.final:
            assert time.monotonic() < deadline, f"the workflow did not end: {status}"
            await asyncio.sleep(0.1)
            status = await queue.status(workflow_id)
        for cls in (member, fan_in):  # nothing of either left to deliver again
            await settled(functools.partial(queue.stats, cls), cls.name)
        lines = callback_lines(records)
    finally:
        for worker in logs:
            worker.kill()
    assert kills >= 2, "the members finished before two workers were killed"
    assert status.state == "done" and status.then is not None and status.then.state == "done"
    done = [s for s in status.steps if s.state == "done"]
    assert len(status.steps) == MEMBERS and {s.state for s in status.steps} <= {"done", "dlq"}
    assert all(s.result == 2 * int(s.id.rsplit("~", 1)[1]) for s in done)
    assert lines == [f"{MEMBERS}:{len(done)}:{sum(s.result for s in done)}"], lines
