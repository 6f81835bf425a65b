"""Prometheus metrics, fed by the runtimes' events (opt-in: `metrics = {"enabled": True}`).

The web app serves them at /metrics; `mega scheduler` and `mega worker` on their own ports
(config `metrics.scheduler_port` / `metrics.worker_port`). Metrics only observe: an observer
never changes what a runtime does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

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
    "mega_listener_events_total", "Listener group signals (start, done, retry, fail, dlq, skip)",
    ["group", "event"],
)  # fmt: skip
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


class Observable(Protocol):
    def on(self, name: str, observer: Any) -> Any: ...


def observe_jobs(runtime: Observable) -> None:
    """Count every JobWorker/JobQueue event; time runs and enqueue-to-start latency."""

    def count(signal: dict[str, Any]) -> None:
        job = str(signal.get("job", "unknown"))
        JOB_EVENTS.labels(job, signal["signal"]).inc()
        first_start = signal["signal"] == "start" and signal.get("attempt") == 1
        if first_start and signal.get("latency_ms") is not None:
            JOB_START_LATENCY.labels(job).observe(signal["latency_ms"] / 1000)
        if signal["signal"] in ("done", "retry", "fail") and signal.get("duration_ms") is not None:
            JOB_DURATION.labels(job).observe(signal["duration_ms"] / 1000)

    for name in ("dispatch", "start", "done", "retry", "fail", "dlq"):
        runtime.on(name, count)


def observe_scheduler(runtime: Observable) -> None:
    """Count every tick's signal, time its lateness; the clock offset from each claim."""

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
    """Pool tasks, crashes and durations from events; queue depth and busy slots read live."""
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
    """Count every listener group's signals: delivered (start), done, retry, fail, dlq, skip."""

    def count(signal: dict[str, Any]) -> None:
        LISTENER_EVENTS.labels(str(signal.get("group", "unknown")), signal["signal"]).inc()

    for name in ("start", "done", "retry", "fail", "dlq", "skip"):
        runtime.on(name, count)


def observe_relay(relay: Any) -> None:
    """Rows published, and the relay's lag (oldest pending row age) read live."""
    OUTBOX_LAG.set_function(lambda: relay.lag_ms / 1000)

    def count(signal: dict[str, Any]) -> None:
        OUTBOX_PUBLISHED.inc(signal["count"])

    relay.on("published", count)


def observe_buses(buses: Mapping[str, Any]) -> None:
    """Export the disconnects of every bus of `buses` that counts them."""
    BUS_DISCONNECTS.buses.update(
        (alias, bus) for alias, bus in buses.items() if hasattr(bus, "disconnects")
    )
