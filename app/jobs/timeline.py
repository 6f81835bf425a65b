"""Turns the JobWorker's events into the EmailJob timeline the /demo/jobs page shows, and
into the per-step counts the console's charts draw (app/services/console_series.py).

Attached in mega_config.py as `hooks = {"worker": [attach_timeline]}`: the worker host calls
`attach_timeline(worker, ctx)` once, after registering the jobs.
"""

from __future__ import annotations

from typing import Any

from app.jobs.email import EmailJob
from app.services import console_series, job_timeline
from app.services.instances import short_instance
from mega import Context, JobWorker


def attach_timeline(worker: JobWorker, ctx: Context) -> None:
    redis = ctx.cache("main").native
    # Every attempt names the worker process that ran it (the crash mode moves between them).
    here = short_instance(worker.instance_id)

    async def on_signal(signal: dict[str, Any]) -> None:
        if signal.get("job") != EmailJob.name:
            return
        job_id, attempt, kind = signal["id"], signal.get("attempt"), signal["signal"]
        if kind == "start":
            # Enqueue-to-start latency is what users feel; later attempts wait on the backoff.
            latency = signal.get("latency_ms") if attempt == 1 else None
            waited = f", {latency} ms after enqueue" if latency is not None else ""
            detail = f"attempt {attempt} started on worker {here}{waited}"
            await job_timeline.record_event(
                redis, job_id, "start", detail, status="running", attempt=attempt
            )
            if latency is not None:
                await job_timeline.record_latency(redis, latency)
                await console_series.record_start(redis, worker.instance_id, latency)  # console
        elif kind == "progress":
            await job_timeline.record_progress(redis, job_id, signal["fraction"], signal["note"])
        elif kind == "retry":
            detail = (
                f"attempt {attempt} failed: {signal['error']}; retry in {signal['delay_ms']} ms"
            )
            await job_timeline.record_event(redis, job_id, "retry", detail, status="retrying")
        elif kind == "done":
            detail = f"attempt {attempt} succeeded in {signal['duration_ms']:.0f} ms"
            await job_timeline.record_event(redis, job_id, "done", detail, status="done")
            await console_series.record_done(redis, worker.instance_id)  # console: jobs/s
        elif kind == "fail" and signal.get("phase") == "run":
            if signal["error_type"] == "WorkerCrashed":  # found by the delivery after the last
                detail = f"{signal['error']}; no tries left"
            else:
                detail = f"attempt {attempt} failed: {signal['error']}; no tries left"
            await job_timeline.record_event(redis, job_id, "fail", detail)
        elif kind == "dlq":
            detail = f"moved to the dead-letter queue after {signal['attempts']} attempts"
            await job_timeline.record_event(redis, job_id, "dlq", detail, status="dlq")
            # The console's DLQ line steps up now, even while nobody has the console open.
            stats = await worker.queue(EmailJob.bus).stats(EmailJob)
            await console_series.record_dlq_size(redis, stats.dlq)

    for name in ("start", "progress", "retry", "done", "fail", "dlq"):
        worker.on(name, on_signal)
