"""What a job's `run(payload, ctx)` receives: the host's context plus this run, and a way to
report how far it got (after BullMQ's `job.updateProgress`).

    class ReportJob(Job):
        async def run(self, payload: dict[str, Any], ctx: JobContext) -> None:
            for step in range(1, 6):
                await build_part(step)
                await ctx.progress(step / 5, f"part {step} of 5")

`ctx.progress(fraction, note)` sends the queue's `progress` signal `{job, id, attempt,
fraction, note, worker}`, which a JobRunner re-sends like `start` and `done`; observers decide
what to keep (a page may store the latest one). Nothing is stored or rate-limited here, and a
job that never calls it costs nothing beyond its context: a signal leaves only on a call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from mega.context import Context
from mega.validation import progress_fraction, progress_note

if TYPE_CHECKING:
    from mega.database import Database

# How a run reports: a queue's `signal(name, **fields)`.
Report = Callable[..., Awaitable[None]]


class JobContext(Context):
    """The context of one run of a job: every service of the host's context (`cache`, `lock`,
    `bus`, `db`, `workers`, `extras`, shared, not copied), plus `job` (its name), `job_id`,
    `attempt` (1-based, counted as the queue counts it), `key` (what it was enqueued with, or
    None), `worker` (the consuming process's instance id) and `progress()`.

    Made by the queue for each delivery (see RunContexts); a job never makes one itself.
    """

    job: str
    job_id: str
    attempt: int
    key: str | None
    worker: str
    _base: Context
    _report: Report

    @classmethod
    def for_run(
        cls, base: Context, *, job: str, job_id: str, attempt: int, worker: str, report: Report
    ) -> JobContext:
        """One run's context (RunContexts makes many of one job's, cheaper); its `key` is None.

        Args:
            base: the host's context, whose services the run shares.
            job: the job's name.
            job_id: the run's job id.
            attempt: the run's attempt, 1-based.
            worker: the consuming process's instance id.
            report: where `progress()` sends its signal: a queue's `signal(name, **fields)`.
        """
        return RunContexts(base, job=job, worker=worker, report=report)(job_id, attempt, None)

    # The host's context opens its database lazily, on first use of `db`: both read it there,
    # so it is opened once per process, not once per run, and every run sees it.
    @property
    def database(self) -> Database | None:  # type: ignore[override]  # a read-only view
        return self._base.database

    @property
    def db(self) -> Database:
        return self._base.db

    async def progress(self, fraction: float, note: str | None = None) -> None:
        """Report how far this run has got, as the queue's `progress` signal. ValueError for a
        fraction outside 0..1 (or not a number) or a note that is not text; nothing is sent
        then.

        Args:
            fraction: how much of the run is done, from 0 to 1.
            note: a short text ("step 2 of 5"), cut to 200 characters; None (the default):
                no note.
        """
        await self._report(
            "progress",
            job=self.job,
            id=self.job_id,
            attempt=self.attempt,
            fraction=progress_fraction(fraction),
            note=progress_note(note),
            worker=self.worker,
        )

    def __repr__(self) -> str:
        return f"JobContext(job={self.job!r}, job_id={self.job_id!r}, attempt={self.attempt})"


class RunContexts:
    """Makes the JobContext of each delivery of one job in one consume loop.

    A context is made for every delivery, so it is kept cheap (~0.2 us; dataclasses.replace,
    which runs __init__, takes ~1.3 us): what every run shares (the host's services, the job,
    the worker, where reports go) is gathered once here, and a run adds its id, attempt and
    key.
    """

    def __init__(self, base: Context, *, job: str, worker: str, report: Report) -> None:
        shared = {name: value for name, value in base.__dict__.items() if name != "database"}
        shared.update(job=job, worker=worker, _base=base, _report=report)
        self._shared = shared

    def __call__(self, job_id: str, attempt: int, key: str | None) -> JobContext:
        run_ctx = object.__new__(JobContext)
        attributes = self._shared.copy()
        attributes["job_id"] = job_id
        attributes["attempt"] = attempt
        attributes["key"] = key
        run_ctx.__dict__ = attributes
        return run_ctx
