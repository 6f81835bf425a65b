"""Prometheus metrics, fed by the runtimes' events (opt-in: `metrics = {"enabled": True}`).

The web app serves them at /metrics; `mega scheduler` and `mega worker` on their own ports
(config `metrics.scheduler_port` / `metrics.worker_port`). Metrics only observe: an observer
never changes what a runtime does.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mega import clock
from mega.context import Context
from mega.drivers.base import LaneStats
from mega.jobs.spec import validate_job

# Latency buckets (seconds) from 1 ms to 1 min: jobs and tasks span that whole range.
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _seconds(name: str, documentation: str, label: str) -> Histogram:
    """A histogram of seconds in BUCKETS_S, by one label."""
    return Histogram(name, documentation, [label], buckets=BUCKETS_S)


JOB_EVENTS = Counter("mega_job_events_total", "Job queue events", ["job", "event"])
JOB_DURATION = _seconds("mega_job_duration_seconds", "Run time of one job attempt", "job")
JOB_START_LATENCY = _seconds(
    "mega_job_start_latency_seconds", "From enqueue (or due time) to the start of the run", "job"
)
SCHEDULE_EVENTS = Counter("mega_schedule_events_total", "Scheduler events", ["schedule", "event"])
SCHEDULE_LATENESS = _seconds(
    "mega_schedule_lateness_seconds", "Start of a run minus its planned instant", "schedule"
)
SCHEDULER_CLOCK_OFFSET = Gauge(
    "mega_scheduler_clock_offset_seconds",
    "This scheduler's clock minus its lock server's (Redis TIME), measured at its last claim",
    ["lock"],
)
POOL_TASKS = Counter("mega_pool_tasks_total", "CPU pool tasks by outcome", ["worker", "outcome"])
POOL_CRASHES = Counter("mega_pool_crashes_total", "CPU pool child processes that died", ["worker"])
POOL_DURATION = _seconds("mega_pool_task_duration_seconds", "Run time of one pool task", "worker")
POOL_QUEUE = Gauge("mega_pool_queue_depth", "Tasks waiting for a free slot", ["worker"])
POOL_BUSY = Gauge("mega_pool_busy", "Slots running a task", ["worker"])
LISTENER_EVENTS = Counter(
    "mega_listener_events_total",
    "Listener group signals (start, done, retry, fail, dlq, skip)",
    ["group", "event"],
)
OUTBOX_PUBLISHED = Counter("mega_outbox_published_total", "Outbox rows published by the relay")
OUTBOX_LAG = Gauge(
    "mega_outbox_lag_seconds", "Age of the oldest row still pending after the relay's last batch"
)


class BusDisconnects(Collector):
    """`mega_bus_disconnects_total{bus}`: connections to a bus lost since the process started
    (a node that went away or went silent), read from each bus that counts them (nats)."""

    def __init__(self) -> None:
        self.buses: dict[str, Any] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "mega_bus_disconnects", "Connections to a bus lost (then re-made)", labels=["bus"]
        )
        for alias, bus in self.buses.items():
            family.add_metric([alias], bus.disconnects)
        yield family


BUS_DISCONNECTS = BusDisconnects()
REGISTRY.register(BUS_DISCONNECTS)


class QueueDepths(Collector):
    """`mega_queue_depth{job}` (jobs waiting to run: the queue's `pending`, which counts the
    delayed ones where the driver does, see `LaneStats`) and `mega_queue_oldest_seconds{job}`
    (now minus when the oldest job not settled yet was enqueued; 0 when none), for autoscaling.

    Read from `Bus.stats` of each watched job when scraped, at most once per REFRESH_S on
    mega's clock (a scrape within it gets the last read). A scrape from a thread (the hosts'
    metrics server, the web app's /metrics) waits up to READ_TIMEOUT_S for the read on the
    watching loop; a job whose queue does not answer has no sample rather than a stale one."""

    REFRESH_S = 1.0
    READ_TIMEOUT_S = 2.0

    def __init__(self) -> None:
        self.readers: dict[str, Callable[[], Awaitable[LaneStats]]] = {}
        self.stats: dict[str, LaneStats] = {}
        self.read_at = -math.inf
        self.loop: asyncio.AbstractEventLoop | None = None

    def watch(self, job: str, read: Callable[[], Awaitable[LaneStats]]) -> None:
        """Export `job`'s queue, read by `read()` on the running loop (watching from another
        loop forgets what the last one watched: a process serves one loop's queues)."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self.readers.clear()
            self.stats.clear()
            self.read_at = -math.inf
            self.loop = loop
        self.readers[job] = read

    async def refresh(self) -> None:
        """Read every watched queue, unless that was done within REFRESH_S."""
        if clock.monotonic() - self.read_at < self.REFRESH_S:
            return
        self.read_at = clock.monotonic()
        jobs = list(self.readers)
        found = await asyncio.gather(*(self.readers[job]() for job in jobs), return_exceptions=True)
        for job, stats in zip(jobs, found, strict=True):
            if isinstance(stats, LaneStats):
                self.stats[job] = stats
            else:
                self.stats.pop(job, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._read()
        depth = GaugeMetricFamily(
            "mega_queue_depth", "Jobs waiting to run in the job's queue", labels=["job"]
        )
        oldest = GaugeMetricFamily(
            "mega_queue_oldest_seconds",
            "Age of the oldest job of the queue not settled yet (waiting or running; 0: none)",
            labels=["job"],
        )
        now_ms = clock.now() * 1000
        for job, stats in sorted(self.stats.items()):
            depth.add_metric([job], stats.pending)
            age_s = 0.0 if stats.oldest_ms is None else max(0.0, (now_ms - stats.oldest_ms) / 1000)
            oldest.add_metric([job], age_s)
        yield depth
        yield oldest

    def _read(self) -> None:
        """Refresh on the watching loop: waited for from another thread; from the loop's own
        thread (a synchronous scrape there cannot wait) started for the next scrape."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            self.stats.clear()  # what was read there says nothing now
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            task = loop.create_task(self.refresh())
            _pending.add(task)
            task.add_done_callback(_pending.discard)
            return
        future = asyncio.run_coroutine_threadsafe(self.refresh(), loop)
        try:
            future.result(self.READ_TIMEOUT_S)
        except Exception:  # late or failed: this scrape shows the last read
            future.cancel()


_pending: set[asyncio.Task[None]] = set()  # refreshes started from the loop's own thread
QUEUE_DEPTHS = QueueDepths()
REGISTRY.register(QUEUE_DEPTHS)


def observe_queues(ctx: Context, job_classes: Iterable[type[Any]]) -> None:
    """Export the depth and oldest age of each job's queue (`QueueDepths`), read through a
    JobQueue of the job's bus; call on the running loop. The web host and `mega worker` do it
    for the jobs of the config (`jobs = [...]`)."""
    from mega.jobs.queue import JobQueue

    queues: dict[str, JobQueue] = {}
    for job_cls in job_classes:
        spec = validate_job(job_cls, ctx.buses)
        queue = queues.get(spec.bus) or queues.setdefault(spec.bus, JobQueue(ctx, spec.bus))
        QUEUE_DEPTHS.watch(spec.name, functools.partial(queue.stats, job_cls))


class Observable(Protocol):
    def on(self, name: str, observer: Any) -> Any: ...


def observe_jobs(runtime: Observable) -> None:
    """Count every JobRunner/JobQueue event; time runs and enqueue-to-start latency.

    Args:
        runtime: a JobRunner or a JobQueue; its signals from now on are counted.
    """

    # Each job's labelled series, looked up once: `labels()` validates and locks on every
    # call, and a no-op job sends two signals.
    events = _Series(JOB_EVENTS)
    latencies, durations = _Series(JOB_START_LATENCY), _Series(JOB_DURATION)

    def count(signal: dict[str, Any]) -> None:
        name = signal["signal"]
        job = str(signal.get("job", "unknown"))
        events.of(job, name).inc()
        if name == "start":
            latency_ms = signal.get("latency_ms")
            if signal.get("attempt") == 1 and latency_ms is not None:
                latencies.of(job).observe(latency_ms / 1000)
            return
        duration_ms = signal.get("duration_ms")
        if name in ("done", "retry", "fail") and duration_ms is not None:
            durations.of(job).observe(duration_ms / 1000)

    for name in ("dispatch", "start", "done", "retry", "fail", "dlq"):
        runtime.on(name, count)


class _Series:
    """A metric's labelled children, each made by `labels()` once and kept."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.children: dict[tuple[str, ...], Any] = {}

    def of(self, *labels: str) -> Any:
        child = self.children.get(labels)
        if child is None:
            child = self.children[labels] = self.metric.labels(*labels)
        return child


def observe_scheduler(runtime: Observable) -> None:
    """Count every tick's signal, time its lateness; the clock offset from each claim.

    Args:
        runtime: a Scheduler; its signals from now on are counted.
    """

    def count(signal: dict[str, Any]) -> None:
        schedule = str(signal.get("schedule", "unknown"))
        SCHEDULE_EVENTS.labels(schedule, signal["signal"]).inc()
        if signal["signal"] == "run" and signal.get("lateness_ms") is not None:
            SCHEDULE_LATENESS.labels(schedule).observe(signal["lateness_ms"] / 1000)

    def clock(signal: dict[str, Any]) -> None:
        SCHEDULER_CLOCK_OFFSET.labels(str(signal["lock"])).set(signal["offset_ms"] / 1000)

    for name in ("run", "skip", "done", "fail"):
        runtime.on(name, count)
    runtime.on("clock", clock)


def observe_pool(pool: Any) -> None:
    """Pool tasks, crashes and durations from events; queue depth and busy slots read live.

    Args:
        pool: a WorkerPool (`ctx.workers[name]`); its `name` labels the metrics.
    """
    name = pool.name
    POOL_QUEUE.labels(name).set_function(lambda: pool.stats()["queued"])
    POOL_BUSY.labels(name).set_function(lambda: pool.stats()["busy"])

    def count(signal: dict[str, Any]) -> None:
        if signal["signal"] == "crash":
            POOL_CRASHES.labels(name).inc()
            return
        outcome = "done" if signal["signal"] == "done" else str(signal.get("code", "failed"))
        POOL_TASKS.labels(name, outcome).inc()
        if signal.get("ms") is not None:
            POOL_DURATION.labels(name).observe(signal["ms"] / 1000)

    for signal_name in ("done", "fail", "crash"):
        pool.on(signal_name, count)


def observe_listeners(runtime: Observable) -> None:
    """Count every listener group's signals: delivered (start), done, retry, fail, dlq, skip.

    Args:
        runtime: a ListenerRunner; its signals from now on are counted.
    """

    def count(signal: dict[str, Any]) -> None:
        LISTENER_EVENTS.labels(str(signal.get("group", "unknown")), signal["signal"]).inc()

    for name in ("start", "done", "retry", "fail", "dlq", "skip"):
        runtime.on(name, count)


def observe_relay(relay: Any) -> None:
    """Rows published, and the relay's lag (oldest pending row age) read live.

    Args:
        relay: an OutboxRelay; its `published` signals from now on are counted.
    """
    OUTBOX_LAG.set_function(lambda: relay.lag_ms / 1000)

    def count(signal: dict[str, Any]) -> None:
        OUTBOX_PUBLISHED.inc(signal["count"])

    relay.on("published", count)


def observe_buses(buses: Mapping[str, Any]) -> None:
    """Export the disconnects of every bus of `buses` that counts them."""
    BUS_DISCONNECTS.buses.update(
        (alias, bus) for alias, bus in buses.items() if hasattr(bus, "disconnects")
    )
