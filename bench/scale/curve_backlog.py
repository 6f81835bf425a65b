"""A worker's job rate and memory against the backlog it drains: 20,000, 200,000 and
1,000,000 no-op jobs waiting, on the nats, redis and postgres drivers. Targets: the rate at
1,000,000 at least 0.8x the rate at 20,000; the worker's RSS flat (at most 1.25x).

The backlog is enqueued first (`enqueue_many`, untimed), then one `mega worker` process runs
the no-op job (bench/jobs_noop.py, concurrency 200, status records on): the rate is how fast it
ran MEASURED jobs once it had run its first WARMUP_JOBS (its own metrics, read every
POLL_S); its RSS (VmRSS) is read at the end; a point is the median of TRIES such workers. The
worker is stopped before the backlog grows to the next point, so each point is a fresh process
draining the backlog as it stands.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.report import Result, Row
from bench.scale import curve, last_against_first
from bench.scale.site import write_config
from mega import JobQueue, load_config
from mega.drivers.embedded import free_port
from mega.runtime import boot, shutdown

BACKLOGS = (20_000, 200_000, 1_000_000)
DRIVERS = ("nats", "redis", "postgres")
RATE_TARGET = 0.8
RSS_TARGET = 1.25
WARMUP_JOBS = 3_000  # the worker's start and its first jobs, left out of the rate
MEASURED = 16_000  # the jobs the rate is measured over (both fit in the smallest backlog)
POLL_S = 0.05
DRAIN_LIMIT_S = 120.0
BATCH = 10_000
# Each point is the median of this many workers' rates, the backlog filled again before each:
# one worker's rate over a few seconds varies by a third from run to run on a shared machine.
TRIES = 3
BODY = """import os
from bench.jobs_noop import NoopJob
jobs = [NoopJob]
# The worker's metrics, on the port the curve gives it: its count of jobs done is the figure.
metrics = {"enabled": True, "bind": "127.0.0.1",
           "worker_port": int(os.environ.get("MEGA_WORKER_METRICS_PORT", "9102"))}
"""
ROOT = Path(__file__).resolve().parents[2]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _point(
    config: Path, queue: JobQueue, job: Any, backlog: int, log: Path
) -> tuple[float, float]:
    """One worker on the backlog as it stands: (jobs/s while it ran MEASURED jobs, after its
    first WARMUP_JOBS; RSS in MB at the end)."""
    port = free_port()
    env = {**os.environ, "BENCH_JOBS_SUBJECT": job.subject, "MEGA_WORKER_METRICS_PORT": str(port)}
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "mega", "worker", "--config", str(config)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        started = await _ran(WARMUP_JOBS, port, worker, log)
        ended = await _ran(WARMUP_JOBS + MEASURED, port, worker, log)
        rss = _rss_mb(worker.pid)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    return MEASURED / (ended - started), rss


async def _ran(jobs: int, port: int, worker: subprocess.Popen[bytes], log: Path) -> float:
    """When (perf_counter) the worker had run `jobs`, by its own metrics read every POLL_S (not
    by the bus's count of waiting jobs, which is a scan of every row on PostgreSQL)."""
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while _done(port) < jobs:
        assert worker.poll() is None, log.read_text(errors="replace")[-2000:]
        assert time.monotonic() < deadline, f"not {jobs:,} jobs run in time: {log}"
        await asyncio.sleep(POLL_S)
    return time.perf_counter()


def _done(port: int) -> float:
    """The worker's jobs done so far (mega_job_events_total, event "done"); 0 before it serves."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mega_job_events_total{") and 'event="done"' in line
    )


async def _fill(queue: JobQueue, job: Any, backlog: int) -> None:
    """Enqueue until `backlog` jobs wait (what a point before left waiting counts)."""
    waiting = (await queue.stats(job)).pending
    while waiting < backlog:
        count = min(BATCH, backlog - waiting)
        await queue.enqueue_many(job, range(waiting, waiting + count))
        waiting += count


async def _driver(driver: str, urls: dict[str, str], folder: Path) -> dict[str, Any]:
    from bench.jobs_noop import job_class

    job = job_class(f"bench.scale.{driver}")
    path = write_config(folder, driver, urls, BODY)
    ctx = await boot(load_config(path), role="bench", database=False)
    rates: list[tuple[int, float]] = []
    rss: list[tuple[int, float]] = []
    try:
        queue = JobQueue(ctx, "jobs")
        await queue.ensure(job)
        for backlog in BACKLOGS:
            tries: list[tuple[float, float]] = []
            filled_s = 0.0
            for attempt in range(TRIES):
                started = time.perf_counter()
                await _fill(queue, job, backlog)
                filled_s += time.perf_counter() - started
                log = folder / f"worker-{driver}-{backlog}-{attempt}.log"
                tries.append(await _point(path, queue, job, backlog, log))
            rate = statistics.median(rate for rate, _ in tries)
            mb = max(mb for _, mb in tries)
            rates.append((backlog, rate))
            rss.append((backlog, mb))
            print(
                f"  {driver} at {backlog:,} waiting (filled in {filled_s:.0f} s): "
                f"{rate:,.0f} jobs/s (median of {', '.join(f'{r:,.0f}' for r, _ in tries)}), "
                f"RSS {mb:.0f} MB",
                flush=True,
            )
    finally:
        await shutdown(ctx)
    return {"rate": rates, "rss": rss}


async def run(urls: dict[str, str]) -> Result:
    found = {}
    with tempfile.TemporaryDirectory(prefix="scale-backlog-") as tmp:
        for driver in DRIVERS:
            found[driver] = await _driver(driver, urls, Path(tmp))
    rows: list[Row] = []
    for driver in DRIVERS:
        large = BACKLOGS[-1]
        rows.append(
            last_against_first(
                f"{driver}: jobs/s with {large:,} waiting", found[driver]["rate"], RATE_TARGET
            )
        )
        rows.append(
            last_against_first(
                f"{driver}: worker RSS with {large:,} waiting (MB)",
                found[driver]["rss"],
                RSS_TARGET,
                most=True,
            )
        )
    charts = [
        {
            "name": "backlog_rate",
            "title": "Job rate against the backlog",
            "x_label": "jobs waiting",
            "y_label": "no-op jobs/s, one worker",
            "series": {d: found[d]["rate"] for d in DRIVERS},
        },
        {
            "name": "backlog_rss",
            "title": "Worker RSS against the backlog",
            "x_label": "jobs waiting",
            "y_label": "MB (VmRSS)",
            "series": {d: found[d]["rss"] for d in DRIVERS},
        },
    ]
    return curve(
        "backlog",
        "Jobs: one worker's rate and memory against the backlog",
        f"{', '.join(f'{b:,}' for b in BACKLOGS)} no-op jobs waiting; one `mega worker` "
        f"(concurrency 200, status records on): its rate over {MEASURED:,} jobs, after its first "
        f"{WARMUP_JOBS:,}; its RSS after them; the median of {TRIES} workers, the backlog filled "
        "again before each.",
        rows,
        charts,
        found,
    )
