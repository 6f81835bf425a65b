"""A tiny job-consumer host for tests/mega/test_jobs_faults.py.

    python -m tests.mega.jobs_fault_worker URL SUBJECT MODE LOG [--retries N] [--ack-wait S]

It stands in for `mega worker` (not written yet): one NATS bus, one `FaultJob`, a JobWorker run
until SIGTERM (graceful drain, exit 0) or until the job kills the process. It prints `ready`
once consuming, and appends one line per observation to LOG, which the test reads:

    start <id> <attempt> <pid>      a run begins (from the `start` event)
    done <id> <attempt> <pid>       a run succeeded
    dlq <id> <pid>                  the job was dead-lettered

MODE says what `run` does: `ok` returns, `hang` sleeps for an hour (the test SIGKILLs us),
`exit` calls os._exit (a segfault or an OOM kill as the queue sees it), `slow` takes 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import nats

from app.mega.context import BusAdapter, Context
from app.mega.job import Job
from app.mega.jobworker import JobWorker

BUS = "jobs"


def fault_job(subject: str, mode: str, retries: int, ack_wait_s: float) -> type[Job]:
    """The job class both sides use: the test enqueues it, this host runs it."""

    async def run(self: Job, payload: Any, ctx: Context) -> None:
        if mode == "hang":
            await asyncio.sleep(3600)
        elif mode == "exit":
            os._exit(3)
        elif mode == "slow":
            await asyncio.sleep(1)

    attrs = {
        "subject": subject,
        "bus": BUS,
        "retries": retries,
        "ack_wait_s": ack_wait_s,
        "backoff": {"type": "exponential", "initial": 10, "max": 10},
        "run": run,
    }
    return type("FaultJob", (Job,), attrs)


def write(log: Path, line: str) -> None:
    # One write per line with O_APPEND: whole lines, even from processes killed mid-run.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def main(args: argparse.Namespace) -> None:
    log = Path(args.log)
    job = fault_job(args.subject, args.mode, args.retries, args.ack_wait)
    nc = await nats.connect(args.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    ctx = Context(instance_id=f"fault-{os.getpid()}", buses={BUS: BusAdapter(BUS, args.url, nc)})
    worker = JobWorker(ctx)
    worker.register(job)
    pid = os.getpid()
    worker.on("start", lambda e: write(log, f"start {e['id']} {e['attempt']} {pid}"))
    worker.on("done", lambda e: write(log, f"done {e['id']} {e['attempt']} {pid}"))
    worker.on("dlq", lambda e: write(log, f"dlq {e['id']} {pid}"))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await worker.start()
    print("ready", flush=True)
    await stop.wait()
    await worker.stop(timeout_s=10)
    await nc.drain()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("subject")
    parser.add_argument("mode", choices=["ok", "hang", "exit", "slow"])
    parser.add_argument("log")
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--ack-wait", type=float, default=1.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
