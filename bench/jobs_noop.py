"""The job of bench_jobs: `NoopJob`, a no-op that records which payload ran, and when.

`bench_jobs` writes a config listing `NoopJob` and starts a real `mega worker` on it; the worker
imports this module through that config. Everything is set by environment variables, read at
import, so one module serves every run:

    BENCH_JOBS_SUBJECT      the job subject (unique per run; default "bench.noop")
    BENCH_JOBS_CONCURRENCY  the job's concurrency (default 200)
    BENCH_JOBS_DIR          when set, every run is recorded and written at exit to
                            <dir>/<pid>.json as [[payload, epoch seconds at start of run], ...]
    BENCH_JOBS_PROFILE      when set, the whole process runs under cProfile and its stats are
                            dumped there at exit (read them with `python -m pstats`)

Recording is one `time.time()` and one `list.append` per job (well under a microsecond,
against tens of microseconds for the queue's own work per job), kept in memory and written once
at exit, so it never adds I/O to the measured path. Exit means the graceful path (SIGTERM ->
drain -> return): a worker killed with SIGKILL leaves no file, and the benchmark says so.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from app.mega.job import Job

if TYPE_CHECKING:
    from app.mega.context import Context

SUBJECT_ENV = "BENCH_JOBS_SUBJECT"
CONCURRENCY_ENV = "BENCH_JOBS_CONCURRENCY"
RECORD_DIR_ENV = "BENCH_JOBS_DIR"
PROFILE_ENV = "BENCH_JOBS_PROFILE"
DEFAULT_SUBJECT = "bench.noop"
DEFAULT_CONCURRENCY = 200

# (payload, epoch s when run() started), in the order the jobs started.
RECORDS: list[tuple[Any, float]] = []


class NoopJob(Job):
    """Does nothing but note its payload and start time (when BENCH_JOBS_DIR is set)."""

    subject = os.environ.get(SUBJECT_ENV, DEFAULT_SUBJECT)
    bus = "jobs"
    concurrency = int(os.environ.get(CONCURRENCY_ENV, str(DEFAULT_CONCURRENCY)))
    retries = 0  # a no-op never fails; a second run of a job would be a duplicate, not a retry
    record: ClassVar[bool] = bool(os.environ.get(RECORD_DIR_ENV))

    async def run(self, payload: Any, ctx: Context) -> None:
        if self.record:
            RECORDS.append((payload, time.time()))


def job_class(subject: str, concurrency: int = DEFAULT_CONCURRENCY) -> type[NoopJob]:
    """A NoopJob on another subject, for the benchmark's own process (which enqueues only)."""
    return type("NoopJob", (NoopJob,), {"subject": subject, "concurrency": concurrency})


def _write_records(directory: Path) -> None:
    path = directory / f"{os.getpid()}.json"
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(RECORDS, separators=(",", ":")))
    partial.replace(path)  # the benchmark never reads half a file


def _start_profile(path: str) -> None:
    import cProfile

    profile = cProfile.Profile()
    profile.enable()

    def dump() -> None:
        profile.disable()
        profile.dump_stats(path)

    atexit.register(dump)


if os.environ.get(RECORD_DIR_ENV):
    atexit.register(_write_records, Path(os.environ[RECORD_DIR_ENV]))
if os.environ.get(PROFILE_ENV):
    _start_profile(os.environ[PROFILE_ENV])
