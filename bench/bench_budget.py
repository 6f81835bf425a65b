"""The per-job budget: what the framework itself costs a no-op job, part by part.

    .venv/bin/python -m bench.bench_budget [--jobs 20000]

N no-op jobs on the memory driver (no I/O: what is left is mega's own work and asyncio's),
drained by one consume loop (concurrency 200), in configurations that differ by one part each,
alternated over ROUNDS rounds, the best of each kept (the machine's pace moves):

- shipped: what `mega worker` runs with the default config: status records on, the host's
  signal log at INFO (its summary line counts the runs the consume loops count: no `start` or
  `done` signal is built), no metrics, no time limit, no middleware, no trace SDK;
- without the signal log, then also without status records (`keep_status_s = 0`): the core
  left is the consume loop, the executor and its stages;
- shipped plus one part: metrics on (`observe_jobs`), one middleware that only calls the next,
  a time limit (`timeout_s`);
- the floor: the memory driver's own receiver with one asyncio task per delivery that runs the
  same job function and acks: the engine and asyncio, no mega.

A part's cost is the difference of microseconds per job between two configurations that differ
by it. The same no-op job then drains from a private nats-server (JetStream, file storage) in
one consume loop of this process, shipped: the memory driver's rate is held to a multiple of
that one. Every job is checked to have run exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_drivers import RAN, Noop, driver_context
from bench.report import Result, print_table, result, row
from mega import Context, JobQueue, JobRunner
from mega.jobs.spec import job_lane
from mega.runtime.logs import observe_signals
from mega.testing import memory_context

ROUNDS = 5
# The memory driver's rate against the NATS driver's, both shipped, in the same run.
NATS_MULTIPLE_TARGET = 10.0
# What a worker host observes (mega/runtime/hosts.py): every signal, `start` and `done` counted.
HOST_SIGNALS = ("start", "done", "retry", "fail", "dlq", "cancel")
HOST_ROUTINE = ("start", "done")


class Unrecorded(Noop):
    subject = "bench.unrecorded"
    keep_status_s = 0


class TimeLimited(Noop):
    subject = "bench.limited"
    timeout_s = 60.0


async def passing(run: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """A middleware that does nothing but call the next one: the cost of a link."""
    return await call_next(run)


async def _drain(
    ctx: Context, jobs: int, job: type[Noop], *, log: bool, metrics: bool = False
) -> float:
    """Enqueue `jobs` no-op jobs (untimed), then time one consume loop until all have run;
    `log`: observed as a worker host does, `metrics`: with `observe_jobs`. Microseconds per
    job."""
    RAN.clear()
    worker = JobRunner(ctx)
    worker.register(job)
    if log:
        observe_signals(worker, HOST_SIGNALS, routine=HOST_ROUTINE, worker="bench")
    if metrics:
        from mega.runtime.metrics import observe_jobs

        observe_jobs(worker)
    await worker.queue("jobs").enqueue_many(job, range(jobs))
    done = asyncio.Event()
    watch = asyncio.create_task(_until_ran(jobs, done))
    started = time.perf_counter()
    await worker.start()
    await done.wait()
    elapsed = time.perf_counter() - started
    await watch
    await worker.stop(5)
    assert set(RAN.values()) == {1} and sorted(RAN) == list(range(jobs)), "not exactly once"
    return elapsed / jobs * 1_000_000


async def _until_ran(jobs: int, done: asyncio.Event) -> None:
    while len(RAN) < jobs:
        await asyncio.sleep(0.001)
    done.set()


async def _floor(ctx: Context, jobs: int) -> float:
    """The memory driver's receiver, one task per delivery running the job's function then
    its ack, up to 200 at a time: the engine and asyncio, none of mega's consume machinery.
    Microseconds per job."""
    RAN.clear()
    queue = JobQueue(ctx, "jobs")
    spec = await queue.ensure(Noop)
    await queue.enqueue_many(Noop, range(jobs))
    receiver = ctx.bus("jobs").receiver(job_lane(spec), consumer="floor")
    job = Noop()

    async def one(delivery: Any) -> None:
        await job.run(int(delivery.body), ctx)
        await receiver.ack(delivery)

    running: set[asyncio.Task[None]] = set()
    fetched = 0
    started = time.perf_counter()
    while fetched < jobs:
        free = Noop.concurrency - len(running)
        if free <= 0:
            _, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            continue
        for delivery in await receiver.fetch(free):
            running.add(asyncio.create_task(one(delivery)))
            fetched += 1
    await asyncio.gather(*running)
    elapsed = time.perf_counter() - started
    await receiver.close()
    assert set(RAN.values()) == {1} and sorted(RAN) == list(range(jobs)), "not exactly once"
    return elapsed / jobs * 1_000_000


async def _memory(jobs: int) -> dict[str, float]:
    """Each configuration's best microseconds per job over ROUNDS alternated rounds."""
    runs: dict[str, Callable[[], Awaitable[float]]] = {}

    runs["floor"] = lambda: _floor(memory_context("jobs"), jobs)
    runs["core"] = lambda: _drain(memory_context("jobs"), jobs, Unrecorded, log=False)
    runs["records"] = lambda: _drain(memory_context("jobs"), jobs, Noop, log=False)
    runs["shipped"] = lambda: _drain(memory_context("jobs"), jobs, Noop, log=True)
    runs["metrics"] = lambda: _drain(memory_context("jobs"), jobs, Noop, log=True, metrics=True)
    runs["time_limit"] = lambda: _drain(memory_context("jobs"), jobs, TimeLimited, log=True)

    def with_middleware() -> Awaitable[float]:
        ctx = memory_context("jobs")
        ctx.middlewares.append(passing)
        return _drain(ctx, jobs, Noop, log=True)

    runs["middleware"] = with_middleware
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(ROUNDS):
        for name, run in runs.items():
            best[name] = min(best[name], await run())
    return best


async def _nats(jobs: int) -> float:
    """The same no-op job, shipped, from a private nats-server: best microseconds per job."""
    from mega.drivers.nats.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats").start()
        try:
            best = float("inf")
            for _ in range(3):
                ctx = await driver_context("nats", server.url)
                try:
                    best = min(best, await _drain(ctx, jobs, Noop, log=True))
                finally:
                    await ctx.bus("jobs").close()
            return best
        finally:
            server.stop()


async def _bench(jobs: int) -> Result:
    us = await _memory(jobs)
    nats_us = await _nats(jobs)
    memory_rate, nats_rate = 1_000_000 / us["shipped"], 1_000_000 / nats_us
    multiple = memory_rate / nats_rate

    def us_row(label: str, value: float) -> Any:
        return row(label, value, show=lambda v: f"{v:,.1f} us")

    parts = {
        "the consume loop, the executor and its stages": us["core"] - us["floor"],
        "status records (`running`, then `done`)": us["records"] - us["core"],
        "the host's signal log at INFO": (us["shipped"] - us["records"]),
    }
    own = us["shipped"] - us["floor"]
    res = result(
        "budget",
        "The per-job budget: what mega costs a no-op job, part by part",
        f"{jobs:,} no-op jobs per run on the memory driver, concurrency 200, one consume loop; "
        f"best of {ROUNDS} alternated rounds; the NATS driver's the same, from a private "
        "nats-server (best of 3)",
        [
            us_row(
                "the floor: the memory engine and one asyncio task per job (us/job)", us["floor"]
            ),
            us_row("shipped, as `mega worker` runs it (us/job)", us["shipped"]),
            us_row("mega's own: shipped minus the floor (us/job)", own),
            *(us_row(f"  {label} (us/job)", cost) for label, cost in parts.items()),
            us_row("  + metrics on (`observe_jobs`) (us/job)", us["metrics"] - us["shipped"]),
            us_row(
                "  + one middleware that calls the next (us/job)", us["middleware"] - us["shipped"]
            ),
            us_row("  + a time limit (`timeout_s`) (us/job)", us["time_limit"] - us["shipped"]),
            row("memory driver, shipped (jobs/s)", memory_rate),
            row(
                "memory driver against the NATS driver, both shipped (jobs/s)",
                memory_rate,
                baseline=nats_rate,
                baseline_name="nats",
                target=f">= {NATS_MULTIPLE_TARGET:g}x",
                passed=multiple >= NATS_MULTIPLE_TARGET,
            ),
        ],
        notes=[
            "each part's cost is the difference between two configurations that differ by it "
            "alone, in microseconds per job; the three indented under mega's own add up to it",
            "the floor runs the job's own function in a task per delivery and acks it, as the "
            "consume loop does, with nothing else: no decode, no record, no signal, no stage",
        ],
        data={"us_per_job": us, "nats_us_per_job": nats_us, "multiple": multiple},
    )
    print_table(res)
    return res


def run(jobs: int = 20_000) -> Result:
    return asyncio.run(_bench(jobs))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    return 0 if run(parser.parse_args().jobs)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
