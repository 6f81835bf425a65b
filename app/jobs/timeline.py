"""Turns the JobWorker's events into the EmailJob timeline the /demo/jobs page shows, and
into the per-step counts the console's charts draw (app/services/console_series.py).

Attached in mega_config.py as `hooks = {"worker": [attach_timeline]}`: the worker host calls
`attach_timeline(worker, ctx)` once, after registering the jobs.

Attempts are counted as the framework counts them: attempt N is the Nth run of the job, and
the delivery after the last attempt, which is not run, names the attempt before it.
"""

from __future__ import annotations

from typing import Any

from app.jobs.email import EmailJob
from app.services import console_series, job_timeline
from app.services.instances import short_instance
from app.services.job_timeline import Due, JobState, clock, now_ms
from mega import Context, JobWorker


def start_detail(attempt: int, worker: str, state: JobState, at_ms: int) -> str:
    """The start line: which attempt, on which worker, and how long after it was due (a
    delayed job also says how long after its enqueue; a redelivery was due at no set time)."""
    line = f"attempt {attempt} started on worker {worker}"
    due = state.due
    if due is None:
        return line
    late = f"{max(0, at_ms - due.at)} ms"
    if due.after == "enqueue":
        return f"{line}, {late} after enqueue"
    if due.after == "delay":
        waited = max(0, at_ms - state.created_at)
        return f"{line}, {late} after it was due, {waited} ms after enqueue"
    if due.after == "requeue":
        return f"{line}, {late} after the requeue"
    return f"{line}, {late} after it was due"


def redelivered_detail(worker: str) -> str:
    """Said when a delivery arrives while the attempt before it never reported back."""
    return f"no ack within {EmailJob.ack_wait_s:g} s: worker {worker} died, redelivered"


def attach_timeline(worker: JobWorker, ctx: Context) -> None:
    redis = ctx.cache("main").native
    # Every attempt names the worker process that ran it (the crash mode moves between them).
    here = short_instance(worker.instance_id)

    async def note_redelivery(job_id: str, state: JobState) -> bool:
        """Say that the running attempt's worker died, if one never reported back."""
        if state.running is None:
            return False
        detail = redelivered_detail(state.running.worker)
        await job_timeline.record_event(redis, job_id, "redelivered", detail)
        return True

    async def on_signal(signal: dict[str, Any]) -> None:
        if signal.get("job") != EmailJob.name:
            return
        job_id, attempt, kind = signal["id"], signal.get("attempt", 0), signal["signal"]
        if kind == "start":
            state = await job_timeline.job_state(redis, job_id)
            if state is not None:  # a job of the page (others have no timeline)
                await note_redelivery(job_id, state)
                at = now_ms()  # the line's time and the figures in it: one instant
                detail = start_detail(attempt, here, state, at)
                await job_timeline.record_event(
                    redis, job_id, "start", detail, status="running", attempt=attempt,
                    worker=here, at=at,
                )  # fmt: skip
            # Enqueue-to-start latency is what users feel; later attempts wait on the backoff.
            latency = signal.get("latency_ms") if attempt == 1 else None
            if latency is not None:
                await job_timeline.record_latency(redis, latency)
                await console_series.record_start(redis, worker.instance_id, latency)  # console
        elif kind == "progress":
            await job_timeline.record_progress(redis, job_id, signal["fraction"], signal["note"])
        elif kind == "retry":
            # The planned time, not only the backoff's draw: the start may come later than it.
            detail = (
                f"attempt {attempt} failed: {signal['error']}; retry due at "
                f"{clock(signal['run_at'])} (backoff drew {signal['delay_ms']} ms)"
            )
            due = Due(signal["run_at"], "retry")
            await job_timeline.record_event(
                redis, job_id, "retry", detail, status="retrying", due=due
            )
        elif kind == "done":
            detail = f"attempt {attempt} succeeded in {signal['duration_ms']:.0f} ms"
            await job_timeline.record_event(redis, job_id, "done", detail, status="done")
            await console_series.record_done(redis, worker.instance_id)  # console: jobs/s
        elif kind == "fail" and signal.get("phase") == "run":
            detail = f"attempt {attempt} failed: {signal['error']}; no tries left"
            if signal["error_type"] == "WorkerCrashed":  # found by the delivery after the last
                state = await job_timeline.job_state(redis, job_id)
                if state is not None and await note_redelivery(job_id, state):
                    # The timeline saw that attempt start and never end: the cause is known.
                    detail = (
                        f"attempt {attempt} of {EmailJob.retries + 1} died with its worker; "
                        "no tries left, so this delivery is not run"
                    )
                else:
                    detail = f"{signal['error']}; no tries left"
            await job_timeline.record_event(redis, job_id, "fail", detail)
        elif kind == "fail" and signal.get("phase") == "dlq_publish":
            detail = (
                f"the DLQ record of attempt {attempt} could not be written ({signal['error']}); "
                "the job comes back to try again"
            )
            await job_timeline.record_event(redis, job_id, "fail", detail)
        elif kind == "dlq":
            detail = f"moved to the dead-letter queue after {signal['attempts']} attempts"
            await job_timeline.record_event(redis, job_id, "dlq", detail, status="dlq")
            # The console's DLQ line steps up now, even while nobody has the console open.
            stats = await worker.queue(EmailJob.bus).stats(EmailJob)
            await console_series.record_dlq_size(redis, stats.dlq)

    for name in ("start", "progress", "retry", "done", "fail", "dlq"):
        worker.on(name, on_signal)
