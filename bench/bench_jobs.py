"""The job queue: consume and enqueue throughput, start latency and worker memory.

    .venv/bin/python -m bench.bench_jobs [--jobs 20000] [--concurrency 200] [--latency-s 10]

Starts a private EmbeddedNats (JetStream on file storage in a temporary directory), then, each
figure against a baseline timed in the same run on the same server:

1. enqueue: `await queue.enqueue(Job, i)` one at a time vs a bare awaited `js.publish` loop
   (target >= 0.95x; alternating blocks of 500, so both see the same background load), and
   `enqueue_many` of `--jobs` payloads vs bare `js.publish_async` with every future gathered
   (target >= 0.8x; best of `--rounds` alternating rounds each side). The last pipelined round
   fills the two backlogs of step 2 (a bare stream and the job's stream).
2. consume: a no-op job (`bench.jobs_noop.NoopJob`, a subject unique to the run) drained from
   that backlog by ONE real `mega worker` process, spawned after the backlog is in. End-to-end
   jobs/s (spawn to the last job) and steady jobs/s (job 2,000 to job 18,000 of 20,000), against
   the same figures of a bare nats-py loop (pull_subscribe + fetch(batch=100) + ack, in a
   subprocess too) on the bare backlog (targets: end to end >= 0.9x, steady >= 1.0x); every
   job must have run exactly once (the job's own records, plus an empty stream and no
   redelivery on the consumer); worker spawn to first job (target < 0.25 s).
3. memory and latency, on a second `mega worker` started on an empty stream: its idle RSS
   (target < 100 MB), RSS after draining `--jobs` more jobs (target: growth < 10%), then
   enqueue-to-start latency of one job every 2 ms (500 jobs/s) for `--latency-s` s, from the
   time the payload carries (taken just before `enqueue`) to the time the job starts
   (target p99 < 10 ms).

Workers log at the level an operator gets by default (MEGA_LOG_LEVEL unset: INFO; `--log-level`
to change it) into files in the temporary directory. Takes about 40 s; every child process is
killed at the end, on error too. `--profile` runs the consume worker under cProfile and prints
where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import nats
import nats.errors
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

if __package__ in (None, ""):  # run by path (python bench/x.py): make `app`, `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import Result, Row, ms, percentile, print_table, result, row
from mega.drivers.nats.names import dlq_stream_name, stream_name

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.js import JetStreamContext

    from bench.jobs_noop import NoopJob
    from mega.jobs.queue import JobQueue

ROOT = Path(__file__).resolve().parents[1]
SECRET_KEY = "bench-secret-key-" + "x" * 32  # the config needs one outside dev (unused here)

# The targets each row of the table is held to.
CONSUME_TARGET = 0.9  # mega worker end-to-end jobs/s >= this x the bare fetch+ack loop
STEADY_TARGET = 1.0  # and its steady rate >= this x the bare loop's (the next pull hidden)
STATUS_TARGET = 0.85  # its steady rate with status records >= this x without them
SPAN_TARGET = 1.2  # mega's span around a run <= this x the SDK's own span alone
TRACED_TARGET = 0.8  # its steady rate with the OpenTelemetry SDK on >= this x without it
SAMPLED = 0.1  # the share of traces a sampled run keeps (OTEL_TRACES_SAMPLER_ARG's example)
TRACED_ROUNDS = 2  # untraced, traced and sampled drains alternated this many times
ENQUEUE_TARGET = 0.95  # one-at-a-time enqueue >= this x bare awaited js.publish
ENQUEUE_MANY_TARGET = 0.8  # enqueue_many >= this x bare pipelined publish_async
FIRST_JOB_TARGET_S = 0.25  # worker spawn to first job
LATENCY_P99_TARGET_MS = 10.0
IDLE_RSS_TARGET_MB = 100.0
RSS_GROWTH_TARGET = 1.10

BARE_BATCH = 100  # the baseline's fetch batch: fetch(batch=100) + ack
STEADY_FROM, STEADY_TO = 0.1, 0.9  # the steady window: job 2,000 to 18,000 of 20,000
WARMUP_MSGS = 200  # untimed publishes per side, so both start on a warm connection
ENQUEUE_BLOCK = 500  # awaited publishes per timed block, the two sides alternating
DRAIN_TIMEOUT_S = 60.0  # a drain that takes longer than this is a failure, not a slow run
READY_TIMEOUT_S = 20.0  # worker spawn until its pull request is waiting
STOP_TIMEOUT_S = 15.0  # SIGTERM until SIGKILL
POLL_S = 0.05  # consumer-info polling while a worker drains
SETTLE_S = 1.0  # idle time before an RSS reading
LOG_TAIL_CHARS = 2000
PROFILE_LINES = 25


# -- the bare consume loop, run as its own process (`--bare-consume`) ---------------------------


async def _bare_consume(url: str, stream: str, subject: str, count: int) -> dict[str, Any]:
    """Drain `count` messages with fetch(batch=100) + ack; the times (epoch s) of each."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(subject, durable="bare", stream=stream)
    times: list[float] = []
    while len(times) < count:
        try:
            msgs = await sub.fetch(BARE_BATCH, timeout=5)
        except nats.errors.TimeoutError:
            break  # fewer messages than expected: reported as such
        for msg in msgs:
            times.append(time.time())
            await msg.ack()
    await nc.flush()
    last = time.time()
    await nc.close()
    return {"times": times, "last": last}


# -- helpers -------------------------------------------------------------------------------------


class Run(NamedTuple):
    """One run of the no-op job, as it recorded it (see bench.jobs_noop)."""

    id: int
    at: float  # epoch s when run() started
    sent: float  # epoch s just before its enqueue (latency jobs), else 0.0


def exactly_once(runs: list[Run], expected: int) -> dict[str, int]:
    """How far the runs are from ids 0..expected-1, each exactly once."""
    counts = Counter(run.id for run in runs)
    return {
        "runs": len(runs),
        "distinct": len(counts),
        "duplicates": len(runs) - len(counts),
        "missing": sum(1 for i in range(expected) if i not in counts),
        "unexpected": sum(1 for i in counts if not 0 <= i < expected),
    }


@dataclass
class Worker:
    """One `mega worker` child process and what it recorded."""

    label: str
    proc: subprocess.Popen[bytes]
    spawned_at: float  # epoch s just before the spawn
    log: Path
    records_dir: Path
    profile: Path | None = None
    rss_kb: dict[str, int] = field(default_factory=dict)
    imported_at: float = 0.0  # epoch s when the worker's config imported bench.jobs_noop

    def rss(self, label: str) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                self.rss_kb[label] = int(line.split()[1])
                return self.rss_kb[label]
        raise RuntimeError(f"no VmRSS for pid {self.proc.pid}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.label} worker exited with {self.proc.returncode}:\n{_tail(self.log)}"
            )

    def stop(self) -> list[Run]:
        """SIGTERM (graceful drain, records written at exit); its records."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill(self.proc)
                raise RuntimeError(
                    f"{self.label} worker ignored SIGTERM:\n{_tail(self.log)}"
                ) from None
        path = self.records_dir / f"{self.proc.pid}.json"
        if not path.exists():
            raise RuntimeError(f"{self.label} worker left no records:\n{_tail(self.log)}")
        body = json.loads(path.read_text())
        self.imported_at = body["imported_at"]
        return [Run(*run) for run in zip(body["ids"], body["times"], body["sent"], strict=True)]


def _kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    return ""


def _child_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        # Per-alias URL overrides (NATS_JOBS_URL, ...) would point the worker elsewhere.
        if not (key.startswith(("REDIS_", "NATS_")) and key.endswith("_URL"))
        and key not in ("MEGA_CONFIG", "MEGA_ENV")
        and not key.startswith("BENCH_JOBS_")
    }
    return {**env, **extra}


def write_config(tmp: Path, nats_url: str) -> Path:
    """The workers' config: one bus, the no-op job, no caches, locks, database or metrics."""
    path = tmp / "bench_jobs_config.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from bench.jobs_noop import NoopJob

            services = {{"buses": {{"jobs": {{"driver": "nats", "url": {nats_url!r}}}}}}}
            auth = {{"secret_key": {SECRET_KEY!r}}}
            metrics = {{"enabled": False}}
            jobs = [NoopJob]
            """
        )
    )
    return path


def _stream(name: str, subject: str) -> StreamConfig:
    """A bare stream shaped like a job's work stream (work queue, file storage)."""
    return StreamConfig(
        name=name,
        subjects=[subject],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
    )


def interpreter_spawn_s(runs: int = 7) -> float:
    """The median wall time of `python -c pass` in this virtualenv: the floor of any spawn."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return sorted(times)[runs // 2]


def span_costs() -> dict[str, float]:
    """What a traced run's span costs alone (bench.span_cost, in a process of its own: the
    SDK it sets up must not trace this one's enqueues): the SDK's own and mega's, in us."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.span_cost"], cwd=ROOT, check=True, capture_output=True
    )
    return dict(json.loads(done.stdout))


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


@dataclass
class Drain:
    """Throughput figures of one drain of `count` messages from times (epoch s) of each."""

    count: int
    first_s: float  # spawn to first message
    end_to_end: float  # per s, spawn to last message
    steady: float  # per s, between STEADY_FROM and STEADY_TO of the messages

    @classmethod
    def of(cls, times: list[float], spawned_at: float, last: float | None = None) -> Drain:
        ordered = sorted(times)
        n = len(ordered)
        lo, hi = int(n * STEADY_FROM), int(n * STEADY_TO)
        end = max(ordered[-1], last or 0.0)
        return cls(
            count=n,
            first_s=ordered[0] - spawned_at,
            end_to_end=_rate(n, end - spawned_at),
            steady=_rate(hi - lo, ordered[hi] - ordered[lo]),
        )


# -- the benchmark -------------------------------------------------------------------------------


@dataclass
class Options:
    jobs: int = 20_000
    concurrency: int = 200
    enqueue_n: int = 5_000
    rounds: int = 2
    rate: float = 500.0
    latency_s: float = 10.0
    profile: bool = False
    log_level: str | None = None  # MEGA_LOG_LEVEL of the workers (None: their default)


class Bench:
    def __init__(self, options: Options, tmp: Path, nats_url: str) -> None:
        self.o = options
        self.tmp = tmp
        self.url = nats_url
        self.run_id = uuid.uuid4().hex[:8]
        self.config = write_config(tmp, nats_url)
        self.children: list[subprocess.Popen[bytes]] = []
        self.data: dict[str, Any] = {"run_id": self.run_id}
        # Set in connect().
        self.nc: NatsClient
        self.js: JetStreamContext
        self.queue: JobQueue

    def subject(self, part: str) -> str:
        return f"bench.{self.run_id}.{part}"

    def job(self, part: str, *, keep_status_s: float | None = None) -> type[NoopJob]:
        from bench.jobs_noop import job_class

        return job_class(self.subject(part), self.o.concurrency, keep_status_s)

    async def connect(self) -> None:
        from mega.context import Context, new_instance_id
        from mega.drivers.nats import NatsBus
        from mega.jobs.queue import JobQueue
        from mega.settings import BusSpec

        bus = await NatsBus.connect("jobs", BusSpec(driver="nats", url=self.url))
        self.nc, self.js = bus.native, bus.js
        ctx = Context(instance_id=new_instance_id("bench"), buses={"jobs": bus})
        self.queue = JobQueue(ctx, "jobs")

    def kill_children(self) -> None:
        for proc in self.children:
            _kill(proc)

    # -- workers ---------------------------------------------------------------------------

    def spawn_worker(
        self,
        label: str,
        subject: str,
        *,
        profile: bool = False,
        keep_status_s: float | None = None,
        traced: float | None = None,
    ) -> Worker:
        records = self.tmp / f"records-{label}"
        records.mkdir()
        log = self.tmp / f"worker-{label}.log"
        profile_path = self.tmp / f"worker-{label}.prof" if profile else None
        env = _child_env(
            BENCH_JOBS_SUBJECT=subject,
            BENCH_JOBS_CONCURRENCY=str(self.o.concurrency),
            BENCH_JOBS_DIR=str(records),
            BENCH_JOBS_CAPACITY=str(self.o.jobs + int(self.o.rate * self.o.latency_s) + 1000),
            **({"BENCH_JOBS_PROFILE": str(profile_path)} if profile_path else {}),
            **({"MEGA_LOG_LEVEL": self.o.log_level} if self.o.log_level else {}),
            **(
                {"BENCH_JOBS_KEEP_STATUS_S": str(keep_status_s)}
                if keep_status_s is not None
                else {}
            ),
            **({"BENCH_JOBS_TRACED": str(traced)} if traced is not None else {}),
        )
        command = [sys.executable, "-m", "mega", "worker", "--config", str(self.config)]
        with open(log, "wb") as out:
            spawned_at = time.time()
            proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        self.children.append(proc)
        return Worker(label, proc, spawned_at, log, records, profile_path)

    async def wait_drained(self, worker: Worker, stream: str, total: int) -> float:
        """Poll the consumer until `total` messages are delivered and none is unacked."""
        from mega.drivers.nats.names import JOB_CONSUMER as CONSUMER_NAME

        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while True:
            worker.check_alive()
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                info = await self.js.consumer_info(stream, CONSUMER_NAME)
                if (
                    info.delivered.stream_seq is not None
                    and info.delivered.stream_seq >= total
                    and not info.num_pending
                    and not info.num_ack_pending
                ):
                    return time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{worker.label} did not drain in {DRAIN_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S)

    async def wait_ready(self, worker: Worker, stream: str) -> float:
        """Until the worker's first pull request waits on the consumer; spawn-to-ready s."""
        from mega.drivers.nats.names import JOB_CONSUMER as CONSUMER_NAME

        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            worker.check_alive()
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                info = await self.js.consumer_info(stream, CONSUMER_NAME)
                if info.num_waiting:
                    return time.time() - worker.spawned_at
            if time.monotonic() > deadline:
                raise TimeoutError(f"{worker.label} not consuming after {READY_TIMEOUT_S} s")
            await asyncio.sleep(0.01)

    async def check_consumed(self, stream: str, consumer: str) -> dict[str, int]:
        """What the server says after a drain: messages left, unacked and redelivered."""
        info = await self.js.consumer_info(stream, consumer)
        left = (await self.js.stream_info(stream)).state.messages
        return {
            "stream_messages_left": left,
            "num_ack_pending": info.num_ack_pending or 0,
            "num_redelivered": info.num_redelivered or 0,
            "num_pending": info.num_pending or 0,
        }

    # -- 1. enqueue ------------------------------------------------------------------------

    async def bench_enqueue(self) -> dict[str, float]:
        """Rates of the four publishers; fills the consume backlogs last.

        Awaited publishes are timed in alternating blocks of ENQUEUE_BLOCK (whichever side
        goes first alternates too), so both sides see the same background load; pipelined
        ones are whole batches, best of `rounds` alternating rounds."""
        n, many = self.o.enqueue_n, self.o.jobs
        one_job, consume_job = self.job("one"), self.job("consume")
        await self.js.add_stream(_stream("BENCH_BARE_ONE", self.subject("bare_one")))
        await self.js.add_stream(_stream("BENCH_BARE_CONSUME", self.subject("bare_consume")))
        await self.queue.ensure(one_job)
        await self.queue.ensure(consume_job)

        async def bare_awaited(count: int) -> float:
            subject = self.subject("bare_one")
            started = time.perf_counter()
            for i in range(count):
                await self.js.publish(subject, b"%d" % i)
            return time.perf_counter() - started

        async def mega_awaited(count: int) -> float:
            started = time.perf_counter()
            for i in range(count):
                await self.queue.enqueue(one_job, i)
            return time.perf_counter() - started

        async def bare_pipelined(subject: str) -> float:
            js = self.nc.jetstream()  # its own async-publish inbox, as JobQueue has
            started = time.perf_counter()
            futures = [await js.publish_async(subject, b"%d" % i) for i in range(many)]
            await asyncio.gather(*futures)
            return _rate(many, time.perf_counter() - started)

        async def mega_pipelined(job: type[NoopJob]) -> float:
            started = time.perf_counter()
            await self.queue.enqueue_many(job, range(many))
            return _rate(many, time.perf_counter() - started)

        await bare_awaited(WARMUP_MSGS)
        await mega_awaited(WARMUP_MSGS)
        spent = {"bare": 0.0, "mega": 0.0}
        blocks = max(1, n // ENQUEUE_BLOCK)
        for block in range(blocks):
            sides = [("bare", bare_awaited), ("mega", mega_awaited)]
            for side, publish in sides if block % 2 == 0 else sides[::-1]:
                spent[side] += await publish(ENQUEUE_BLOCK)
        sent = blocks * ENQUEUE_BLOCK
        rates: dict[str, list[float]] = {
            "bare1": [_rate(sent, spent["bare"])],
            "mega1": [_rate(sent, spent["mega"])],
            "bareN": [],
            "megaN": [],
        }
        rounds = max(1, self.o.rounds)
        for r in range(rounds):
            last = r == rounds - 1
            if last:  # the backlogs of step 2, on fresh streams
                rates["bareN"].append(await bare_pipelined(self.subject("bare_consume")))
                rates["megaN"].append(await mega_pipelined(consume_job))
            else:
                await self.js.add_stream(_stream(f"BENCH_BARE_MANY{r}", self.subject(f"m{r}")))
                rates["bareN"].append(await bare_pipelined(self.subject(f"m{r}")))
                scratch = self.job(f"many{r}")
                await self.queue.ensure(scratch)
                rates["megaN"].append(await mega_pipelined(scratch))
                spec = self.queue.spec(scratch)
                for stream in (
                    f"BENCH_BARE_MANY{r}",
                    stream_name(spec.subject),
                    dlq_stream_name(spec.subject),
                ):
                    await self.js.delete_stream(stream)  # keep the server's work to the backlog
        for stream in ("BENCH_BARE_ONE", stream_name(one_job.subject)):
            await self.js.delete_stream(stream)
        self.data["enqueue_rounds"] = rates
        return {key: max(values) for key, values in rates.items()}

    # -- 2. consume ------------------------------------------------------------------------

    async def bench_bare_consume(self) -> Drain:
        command = [
            sys.executable,
            "-m",
            "bench.bench_jobs",
            "--bare-consume",
            self.url,
            "BENCH_BARE_CONSUME",
            self.subject("bare_consume"),
            str(self.o.jobs),
        ]
        spawned_at = time.time()
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.children.append(proc)
        try:
            out, err = await asyncio.to_thread(proc.communicate, timeout=DRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise TimeoutError(f"bare consume loop did not finish in {DRAIN_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"bare consume loop failed:\n{err.decode()[-LOG_TAIL_CHARS:]}")
        report = json.loads(out)
        times: list[float] = report["times"]
        if len(times) != self.o.jobs:
            raise RuntimeError(f"bare consume loop got {len(times)} of {self.o.jobs} messages")
        left = (await self.js.stream_info("BENCH_BARE_CONSUME")).state.messages
        if left:
            raise RuntimeError(f"bare consume loop left {left} messages unacked")
        return Drain.of(times, spawned_at, report["last"])

    async def bench_consume_without_status(self) -> Drain:
        """The same drain with the job's status records off (keep_status_s = 0)."""
        job = self.job("nostatus", keep_status_s=0)
        spec = await self.queue.ensure(job)
        await self.queue.enqueue_many(job, range(self.o.jobs))
        worker = self.spawn_worker("nostatus", spec.subject, keep_status_s=0)
        await self.wait_drained(worker, stream_name(spec.subject), self.o.jobs)
        runs = worker.stop()
        return Drain.of([run.at for run in runs], worker.spawned_at)

    async def bench_tracing(self) -> dict[str, Drain]:
        """What tracing costs a worker: drains with the OpenTelemetry SDK on (every trace,
        then SAMPLED of them) and without, alternated for TRACED_ROUNDS rounds so that a
        change of the machine's pace during the run hits both sides; the best of each."""
        best: dict[str, Drain] = {}
        for round_ in range(TRACED_ROUNDS):
            for name, ratio in (("untraced", None), ("traced", 1.0), ("sampled", SAMPLED)):
                drain = await self.bench_consume_traced(ratio, f"{name}{round_}")
                if name not in best or drain.steady > best[name].steady:
                    best[name] = drain
        return best

    async def bench_consume_traced(self, ratio: float | None, label: str) -> Drain:
        """The drain with the OpenTelemetry SDK on in the worker (a span per run, sent to an
        exporter that drops them), `ratio` of the traces sampled; None: no SDK."""
        job = self.job(label)
        spec = await self.queue.ensure(job)
        await self.queue.enqueue_many(job, range(self.o.jobs))
        worker = self.spawn_worker(label, spec.subject, traced=ratio)
        await self.wait_drained(worker, stream_name(spec.subject), self.o.jobs)
        runs = worker.stop()
        return Drain.of([run.at for run in runs], worker.spawned_at)

    async def bench_consume(self) -> tuple[Drain, dict[str, Any]]:
        consume_job = self.job("consume")
        spec = self.queue.spec(consume_job)
        worker = self.spawn_worker("consume", spec.subject, profile=self.o.profile)
        await self.wait_drained(worker, stream_name(spec.subject), self.o.jobs)
        await asyncio.sleep(SETTLE_S)
        worker.rss("after")
        runs = worker.stop()
        server = await self.check_consumed(stream_name(spec.subject), "mega_workers")
        check: dict[str, Any] = {
            **exactly_once(runs, self.o.jobs),
            **server,
            "rss_after_kb": worker.rss_kb["after"],
            "config_imported_s": worker.imported_at - worker.spawned_at,
        }
        check["exactly_once"] = (
            check["runs"] == check["distinct"] == self.o.jobs
            and not check["missing"]
            and not check["unexpected"]
            and not server["stream_messages_left"]
            and not server["num_redelivered"]
        )
        if worker.profile is not None:
            self.data["profile"] = str(worker.profile)
            _print_profile(worker.profile)
        return Drain.of([run.at for run in runs], worker.spawned_at), check

    # -- 3. memory, then latency -------------------------------------------------------------

    async def bench_memory_and_latency(self) -> dict[str, Any]:
        mem_job = self.job("memory")
        spec = await self.queue.ensure(mem_job)
        worker = self.spawn_worker("memory", spec.subject)
        ready_s = await self.wait_ready(worker, stream_name(spec.subject))
        await asyncio.sleep(SETTLE_S)
        idle = worker.rss("idle")
        await self.queue.enqueue_many(mem_job, range(self.o.jobs))
        await self.wait_drained(worker, stream_name(spec.subject), self.o.jobs)
        await asyncio.sleep(SETTLE_S)
        after = worker.rss("after")

        # One awaited enqueue every 1/rate s on an absolute clock (no drift), payload = the
        # time just before enqueue; the job records when it started.
        interval = 1 / self.o.rate
        count = int(self.o.latency_s * self.o.rate)
        late = 0
        enqueue_ms: list[float] = []
        started = time.monotonic()
        for i in range(count):
            wait = started + i * interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -interval:
                late += 1  # more than one slot behind: the producer could not keep the pace
            before = time.time()
            await self.queue.enqueue(mem_job, {"i": self.o.jobs + i, "t": before})
            enqueue_ms.append((time.time() - before) * 1000)
        elapsed = time.monotonic() - started
        await self.wait_drained(worker, stream_name(spec.subject), self.o.jobs + count)
        worker.rss("after_latency")
        runs = worker.stop()
        by_index = sorted((run.id, (run.at - run.sent) * 1000) for run in runs if run.sent)
        latencies = [latency for _, latency in by_index]
        slow = [i for i, latency in by_index if latency >= LATENCY_P99_TARGET_MS]
        bursts = sum(1 for n, i in enumerate(slow) if n == 0 or i != slow[n - 1] + 1)
        bulk = sorted(run.at for run in runs if not run.sent)
        check = exactly_once(runs, self.o.jobs + count)
        once = check["runs"] == check["distinct"] == self.o.jobs + count
        return {
            "ready_s": ready_s,
            "idle_kb": idle,
            "after_kb": after,
            "after_latency_kb": worker.rss_kb["after_latency"],
            "latencies_ms": latencies,
            "sent": count,
            "offered_rate": _rate(count, elapsed),
            "late_enqueues": late,
            "enqueue_ms": enqueue_ms,
            "slow_jobs": len(slow),
            "slow_bursts": bursts,
            "drain_s": bulk[-1] - bulk[0] if bulk else float("nan"),
            "exactly_once": once,
            "server": await self.check_consumed(stream_name(spec.subject), "mega_workers"),
        }


def _print_profile(path: Path) -> None:
    print(f"\nworker profile ({path}), top {PROFILE_LINES} by own time:")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(PROFILE_LINES)
    stats.sort_stats("cumulative").print_stats(PROFILE_LINES)


async def _bench(options: Options) -> Result:
    from mega.drivers.nats.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp_name:
        tmp = Path(tmp_name)
        server = EmbeddedNats(tmp / "nats").start()
        bench = Bench(options, tmp, server.url)
        bench.data["load_before"] = os.getloadavg()[0]
        try:
            await bench.connect()
            enqueue = await bench.bench_enqueue()
            bare = await bench.bench_bare_consume()
            mega, check = await bench.bench_consume()
            unrecorded = await bench.bench_consume_without_status()
            tracing = await bench.bench_tracing()
            check["interpreter_s"] = interpreter_spawn_s()
            check["span_us"] = span_costs()
            memory = await bench.bench_memory_and_latency()
            bench.data["load_after"] = os.getloadavg()[0]
            with contextlib.suppress(Exception):
                await bench.nc.close()
        finally:
            bench.kill_children()
            server.stop()
    return _report(options, bench, enqueue, bare, mega, check, memory, unrecorded, tracing)


def _report(
    o: Options,
    bench: Bench,
    enqueue: dict[str, float],
    bare: Drain,
    mega: Drain,
    check: dict[str, Any],
    memory: dict[str, Any],
    unrecorded: Drain,
    tracing: dict[str, Drain],
) -> Result:
    lat = memory["latencies_ms"]
    p50, p99, worst = percentile(lat, 50), percentile(lat, 99), max(lat) if lat else float("nan")
    idle_mb, after_mb = memory["idle_kb"] / 1024, memory["after_kb"] / 1024
    growth = after_mb / idle_mb
    mb: Callable[[float], str] = lambda v: f"{v:,.1f} MB"  # noqa: E731
    seconds: Callable[[float], str] = lambda v: f"{v:.3f} s"  # noqa: E731
    lo, hi = int(o.jobs * STEADY_FROM), int(o.jobs * STEADY_TO)
    us: Callable[[float], str] = lambda v: f"{v:.1f} us"  # noqa: E731
    sdk_us = check["span_us"]["sdk_us"]
    untraced_us = 1e6 / tracing["untraced"].steady
    traced_us = 1e6 / tracing["traced"].steady - untraced_us
    exactly = Row(
        figure=f"consume: jobs run exactly once (of {o.jobs:,})",
        value=f"{check['distinct']:,} distinct, {check['duplicates']} dup, "
        f"{check['missing']} missing",
        baseline="",
        ratio="",
        target="each exactly once",
        passed=bool(check["exactly_once"]),
    )
    rows: list[Row] = [
        row("consume: bare fetch(100)+ack, end-to-end (msgs/s)", bare.end_to_end),
        row(f"consume: bare fetch(100)+ack, steady {lo:,}-{hi:,} (msgs/s)", bare.steady),
        row(
            "consume: mega worker, end-to-end (jobs/s)",
            mega.end_to_end,
            baseline=bare.end_to_end,
            baseline_name="bare",
            target=f">= {CONSUME_TARGET}x",
            passed=mega.end_to_end >= CONSUME_TARGET * bare.end_to_end,
        ),
        row(
            f"consume: mega worker, steady {lo:,}-{hi:,} (jobs/s)",
            mega.steady,
            baseline=bare.steady,
            baseline_name="bare",
            target=f">= {STEADY_TARGET}x",
            passed=mega.steady >= STEADY_TARGET * bare.steady,
        ),
        row(
            f"consume: status records off (keep_status_s = 0), steady {lo:,}-{hi:,} (jobs/s)",
            unrecorded.steady,
        ),
        row(
            "consume: status records on (the default) vs off, steady",
            mega.steady,
            baseline=unrecorded.steady,
            baseline_name="status off",
            target=f">= {STATUS_TARGET}x",
            passed=mega.steady >= STATUS_TARGET * unrecorded.steady,
        ),
        row(
            "consume: traced, every trace (OpenTelemetry SDK, spans dropped), steady",
            tracing["traced"].steady,
            baseline=tracing["untraced"].steady,
            baseline_name="untraced",
            target=f">= {TRACED_TARGET}x",
            passed=tracing["traced"].steady >= TRACED_TARGET * tracing["untraced"].steady,
        ),
        row(
            f"consume: traced, {SAMPLED:.0%} of traces sampled, steady",
            tracing["sampled"].steady,
            baseline=tracing["untraced"].steady,
            baseline_name="untraced",
            target=f">= {TRACED_TARGET}x",
            passed=tracing["sampled"].steady >= TRACED_TARGET * tracing["untraced"].steady,
        ),
        row("tracing: a run's span, the SDK's own (start, current, end) (us)", sdk_us, show=us),
        row(
            "tracing: a run's span, mega's (`tracing.processing`) (us)",
            check["span_us"]["mega_us"],
            show=us,
            baseline=sdk_us,
            baseline_name="the SDK's own",
            target=f"<= {SPAN_TARGET}x",
            passed=check["span_us"]["mega_us"] <= SPAN_TARGET * sdk_us,
        ),
        row(
            "tracing: what every trace adds to a job in the worker (us)",
            traced_us,
            show=us,
            baseline=sdk_us,
            baseline_name="the SDK's span",
        ),
        exactly,
        row(
            "consume: worker spawn to first job",
            mega.first_s,
            show=seconds,
            baseline=bare.first_s,
            baseline_name="bare loop spawn",
            target=f"< {FIRST_JOB_TARGET_S} s",
            passed=mega.first_s < FIRST_JOB_TARGET_S,
        ),
        row("consume: interpreter spawn (`python -c pass`)", check["interpreter_s"], show=seconds),
        row(
            "enqueue one at a time (jobs/s)",
            enqueue["mega1"],
            baseline=enqueue["bare1"],
            baseline_name="awaited js.publish",
            target=f">= {ENQUEUE_TARGET}x",
            passed=enqueue["mega1"] >= ENQUEUE_TARGET * enqueue["bare1"],
        ),
        row(
            f"enqueue_many of {o.jobs:,} (jobs/s)",
            enqueue["megaN"],
            baseline=enqueue["bareN"],
            baseline_name="publish_async, gathered",
            target=f">= {ENQUEUE_MANY_TARGET}x",
            passed=enqueue["megaN"] >= ENQUEUE_MANY_TARGET * enqueue["bareN"],
        ),
        row(f"latency at {o.rate:.0f} jobs/s: enqueue-to-start p50", p50, show=ms),
        row(
            f"latency at {o.rate:.0f} jobs/s: enqueue-to-start p99",
            p99,
            show=ms,
            target=f"< {LATENCY_P99_TARGET_MS:.0f} ms",
            passed=p99 < LATENCY_P99_TARGET_MS,
        ),
        row(f"latency at {o.rate:.0f} jobs/s: enqueue-to-start max", worst, show=ms),
        row(
            f"latency at {o.rate:.0f} jobs/s: the enqueue call itself p99",
            percentile(memory["enqueue_ms"], 99),
            show=ms,
        ),
        row(
            "memory: worker RSS idle (fresh)",
            idle_mb,
            show=mb,
            target=f"< {IDLE_RSS_TARGET_MB:.0f} MB",
            passed=idle_mb < IDLE_RSS_TARGET_MB,
        ),
        row(
            f"memory: worker RSS after {o.jobs:,} jobs",
            after_mb,
            show=mb,
            baseline=idle_mb,
            baseline_name="idle",
            target=f"< {RSS_GROWTH_TARGET:.2f}x",
            passed=growth < RSS_GROWTH_TARGET,
        ),
        row(
            f"memory: same worker after the latency run (+{memory['sent']:,} jobs)",
            memory["after_latency_kb"] / 1024,
            show=mb,
        ),
        row(
            f"memory: consume worker RSS after its {o.jobs:,}-job drain",
            check["rss_after_kb"] / 1024,
            show=mb,
        ),
    ]
    notes = [
        f"concurrency {o.concurrency}: the job's max_ack_pending; the worker pulls once half "
        f"the slots are free, so it asks for ~{o.concurrency // 2} messages per pull request "
        f"(200: the same batch as the baseline's fetch(batch={BARE_BATCH}); 500 measured ~10% "
        "fewer jobs/s here, with 2.5x the tasks alive and a bit more memory)",
        "timestamps: the no-op job stores (id, time.time(), enqueue time) in arrays allocated "
        "at import (< 1 us and no allocation per job), written once at exit; end-to-end runs "
        "from just before the spawn to the last job's start, for both sides",
        f"exactly once: job records (each id 0..{o.jobs - 1} once), and the server: "
        f"{check['stream_messages_left']} left in the stream, {check['num_redelivered']} "
        f"redelivered, {check['num_ack_pending']} unacked",
        f"second worker: ready (pull waiting) {memory['ready_s']:.3f} s after spawn; drained "
        f"{o.jobs:,} jobs in {memory['drain_s']:.2f} s while they were being enqueued; its "
        f"jobs ran exactly once: {memory['exactly_once']}",
        f"latency: {memory['sent']:,} awaited enqueues at {memory['offered_rate']:.0f}/s "
        f"({memory['late_enqueues']} more than a slot late), measured from the time in the "
        "payload (just before enqueue) to the start of run(); "
        f"{memory['slow_jobs']} jobs at >= {LATENCY_P99_TARGET_MS:.0f} ms, in "
        f"{memory['slow_bursts']} burst(s) of consecutive jobs",
        f"enqueue: {o.enqueue_n:,} awaited publishes per side in alternating blocks of "
        f"{ENQUEUE_BLOCK}; {o.jobs:,} pipelined, best of {o.rounds} alternating rounds per "
        "side; payload the JSON of an int; nats-py's default cap of 4,000 async publishes "
        "in flight on both sides",
        f"worker start-up: {check['config_imported_s']:.3f} s from spawn to its config importing "
        f"the job (interpreter, CLI, config), {mega.first_s - check['config_imported_s']:.3f} s "
        "from there to the first job (host imports, NATS connect, ensure, first pull)",
        f"tracing: the target (>= {TRACED_TARGET}x) leaves tracing "
        f"{untraced_us * (1 / TRACED_TARGET - 1):.1f} us of a no-op job's "
        f"{untraced_us:.1f} us here; the SDK's own span (its TracerProvider, the batch "
        f"processor, an exporter that drops) takes {sdk_us:.1f} us, so no worker that "
        "records every trace of a no-op job reaches it on this machine; a job that does real "
        "work pays the same microseconds, a smaller share of its time",
        "workers log to files at "
        + (f"MEGA_LOG_LEVEL={o.log_level}" if o.log_level else "the default level (INFO)"),
        "producer, broker, worker and the baselines share the machine's cores; 1-minute load "
        f"average {bench.data['load_before']:.2f} before the run, "
        f"{bench.data['load_after']:.2f} after (anything else running skews every figure)",
    ]
    res = result(
        "jobs",
        "Job queue: consume, enqueue, start latency, worker memory",
        f"one `mega worker`, no-op job, {o.jobs:,}-job backlog, concurrency {o.concurrency}; "
        f"enqueue {o.enqueue_n:,} awaited / {o.jobs:,} bulk; latency at {o.rate:.0f} jobs/s "
        f"for {o.latency_s:.0f} s; private nats-server, file storage",
        rows,
        notes=notes,
        data={
            **bench.data,
            "enqueue": enqueue,
            "bare": vars(bare),
            "mega": vars(mega),
            "check": check,
            "memory": {k: v for k, v in memory.items() if k not in ("latencies_ms", "enqueue_ms")},
            "latency_ms": {"p50": p50, "p99": p99, "max": worst, "n": len(lat)},
            "concurrency": o.concurrency,
        },
    )
    print_table(res)
    return res


def run(
    jobs: int = 20_000,
    concurrency: int = 200,
    enqueue_n: int = 5_000,
    rounds: int = 2,
    rate: float = 500.0,
    latency_s: float = 10.0,
    profile: bool = False,
    log_level: str | None = None,
) -> Result:
    """Run every phase once against one private nats-server; print and return the table."""
    options = Options(jobs, concurrency, enqueue_n, rounds, rate, latency_s, profile, log_level)
    return asyncio.run(_bench(options))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--enqueue-n", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--latency-s", type=float, default=10.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the consume worker")
    parser.add_argument("--log-level", help="MEGA_LOG_LEVEL of the workers (default: theirs)")
    parser.add_argument("--bare-consume", nargs=4, metavar=("URL", "STREAM", "SUBJECT", "N"))
    options = parser.parse_args()
    if options.bare_consume:  # the baseline's child process
        url, stream, subject, count = options.bare_consume
        print(json.dumps(asyncio.run(_bare_consume(url, stream, subject, int(count)))))
        return 0
    res = run(
        jobs=options.jobs,
        concurrency=options.concurrency,
        enqueue_n=options.enqueue_n,
        rounds=options.rounds,
        rate=options.rate,
        latency_s=options.latency_s,
        profile=options.profile,
        log_level=options.log_level,
    )
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
