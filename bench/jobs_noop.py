"""The job of bench_jobs: `NoopJob`, a no-op that records which payload ran, and when.

`bench_jobs` writes a config listing `NoopJob` and starts a real `mega worker` on it; the worker
imports this module through that config. Everything is set by environment variables, read at
import, so one module serves every run:

    BENCH_JOBS_SUBJECT      the job subject (unique per run; default "bench.noop")
    BENCH_JOBS_CONCURRENCY  the job's concurrency (default 200)
    BENCH_JOBS_KEEP_STATUS_S  the job's keep_status_s (default the Job's: status records on)
    BENCH_JOBS_DIR          when set, every run is recorded and written at exit to
                            <dir>/<pid>.json as {"ids": [...], "times": [...], "sent": [...],
                            "imported_at": epoch s when the worker imported this module}
    BENCH_JOBS_CAPACITY     runs recorded without allocating (default 50,000; more still work)
    BENCH_JOBS_PROFILE      when set, the whole process runs under cProfile and its stats are
                            dumped there at exit (read them with `python -m pstats`)
    BENCH_JOBS_TRACED       when set, the OpenTelemetry SDK is set up with an exporter that
                            drops every span (behind the batch processor a real setup uses):
                            what tracing costs the worker, not what an exporter does. Its
                            value is the share of traces sampled ("1": every one)

A payload is an int (its id) or {"i": id, "t": epoch s before enqueue}. A run records the id,
the start time (epoch s) and the payload's "t" (0.0 for an int) in three arrays allocated at
import, so recording allocates nothing per job (the worker's RSS is measured around a run) and
costs one `time.time()` and three array stores (well under a microsecond, against tens of
microseconds for the queue's own work per job). They are written once, at exit, so recording
adds no I/O to the measured path. Exit means the graceful path (SIGTERM -> drain -> return): a
worker killed with SIGKILL leaves no file, and the benchmark says so.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from mega.jobs.job import Job
from mega.jobs.spec import DEFAULT_KEEP_STATUS_S

if TYPE_CHECKING:
    from mega.context import Context

SUBJECT_ENV = "BENCH_JOBS_SUBJECT"
CONCURRENCY_ENV = "BENCH_JOBS_CONCURRENCY"
KEEP_STATUS_ENV = "BENCH_JOBS_KEEP_STATUS_S"
RECORD_DIR_ENV = "BENCH_JOBS_DIR"
CAPACITY_ENV = "BENCH_JOBS_CAPACITY"
PROFILE_ENV = "BENCH_JOBS_PROFILE"
TRACED_ENV = "BENCH_JOBS_TRACED"
DEFAULT_SUBJECT = "bench.noop"
DEFAULT_CONCURRENCY = 200
DEFAULT_CAPACITY = 50_000
# When the worker's config imported this module: splits its start-up into "interpreter, CLI
# and config" and "host imports, connect, ensure, first pull, first delivery".
IMPORTED_AT = time.time()


class Records:
    """Runs in the order they started: id, start time and the payload's enqueue time."""

    def __init__(self, capacity: int) -> None:
        # bytes(n) makes the arrays' pages resident now, before any job runs.
        self.ids = array("q", bytes(8 * capacity))
        self.times = array("d", bytes(8 * capacity))
        self.sent = array("d", bytes(8 * capacity))
        self.count = 0

    def add(self, payload: Any, now: float) -> None:
        n = self.count
        if isinstance(payload, dict):
            job_id, sent = payload["i"], payload["t"]
        else:
            job_id, sent = payload, 0.0
        if n < len(self.ids):
            self.ids[n], self.times[n], self.sent[n] = job_id, now, sent
        else:  # past the capacity: correct, just no longer allocation-free
            self.ids.append(job_id)
            self.times.append(now)
            self.sent.append(sent)
        self.count = n + 1

    def write(self, directory: Path) -> None:
        n = self.count
        body = {
            "ids": self.ids[:n].tolist(),
            "times": self.times[:n].tolist(),
            "sent": self.sent[:n].tolist(),
            "imported_at": IMPORTED_AT,
        }
        path = directory / f"{os.getpid()}.json"
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps(body, separators=(",", ":")))
        partial.replace(path)  # the benchmark never reads half a file


RECORDING = bool(os.environ.get(RECORD_DIR_ENV))
RECORDS = Records(int(os.environ.get(CAPACITY_ENV, DEFAULT_CAPACITY)) if RECORDING else 0)


class NoopJob(Job):
    """Does nothing but note its payload and start time (when BENCH_JOBS_DIR is set)."""

    subject = os.environ.get(SUBJECT_ENV, DEFAULT_SUBJECT)
    bus = "jobs"
    concurrency = int(os.environ.get(CONCURRENCY_ENV, str(DEFAULT_CONCURRENCY)))
    keep_status_s = float(os.environ.get(KEEP_STATUS_ENV, str(DEFAULT_KEEP_STATUS_S)))
    retries = 0  # a no-op never fails; a second run of a job would be a duplicate, not a retry
    record: ClassVar[bool] = RECORDING

    async def run(self, payload: Any, ctx: Context) -> None:
        if self.record:
            RECORDS.add(payload, time.time())


def job_class(
    subject: str, concurrency: int = DEFAULT_CONCURRENCY, keep_status_s: float | None = None
) -> type[NoopJob]:
    """A NoopJob on another subject, for the benchmark's own process (which enqueues only)."""
    keep = DEFAULT_KEEP_STATUS_S if keep_status_s is None else keep_status_s
    attributes = {"subject": subject, "concurrency": concurrency, "keep_status_s": keep}
    return type("NoopJob", (NoopJob,), attributes)


def _start_profile(path: str) -> None:
    import cProfile

    profile = cProfile.Profile()
    profile.enable()

    def dump() -> None:
        profile.disable()
        profile.dump_stats(path)

    atexit.register(dump)


def _start_tracing(ratio: float) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


if RECORDING:
    atexit.register(RECORDS.write, Path(os.environ[RECORD_DIR_ENV]))
if os.environ.get(TRACED_ENV):
    _start_tracing(float(os.environ[TRACED_ENV]))
if os.environ.get(PROFILE_ENV):
    _start_profile(os.environ[PROFILE_ENV])
