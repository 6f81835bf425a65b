"""The worker's signals the sample keeps: a running EmailJob's progress for the jobs page, and
the per-step counts the console's charts draw (app/services/console_series.py). Where each
job is, its attempts and errors, the page reads from the framework's status records instead.

Attached in mega_config.py as `hooks = {"worker": [attach_job_observers]}`: the worker host
calls it once, after registering the jobs.
"""

from __future__ import annotations

from typing import Any

from app.jobs.email import EmailJob
from app.services import console_series, recent_jobs
from mega import Context, JobRunner


def attach_job_observers(worker: JobRunner, ctx: Context) -> None:
    redis = ctx.cache("main").native

    async def on_signal(signal: dict[str, Any]) -> None:
        if signal.get("job") != EmailJob.name:
            return
        kind = signal["signal"]
        if kind == "progress":
            await recent_jobs.record_progress(
                redis, signal["id"], signal["attempt"], signal["fraction"], signal["note"]
            )
        elif kind == "start":
            # Enqueue-to-start latency is what users feel; later attempts wait on the backoff.
            latency = signal.get("latency_ms") if signal.get("attempt") == 1 else None
            if latency is not None:
                await console_series.record_start(redis, latency)
        elif kind == "done":
            await console_series.record_done(redis)
        elif kind == "dlq":
            # The console's DLQ line steps up now, even while nobody has the console open.
            stats = await worker.queue(EmailJob.bus).stats(EmailJob)
            await console_series.record_dlq_size(redis, stats.dlq)

    for name in ("progress", "start", "done", "dlq"):
        worker.on(name, on_signal)
