"""`mega jobs ...`: control of a running fleet's jobs from a terminal (`mega schedules ...` is
mega/runtime/schedules_cli.py).

mega jobs stats [--job NAME] [--json]      per job: pending, in flight, dead letters, paused
mega jobs inspect ID [--job NAME] [--json] a job's status record (every job searched by default),
                                           or a workflow's steps
mega jobs cancel ID [--job NAME]           it never runs, or its running task is cancelled
mega jobs retry ID [--job NAME]            its dead letter back onto the queue
mega jobs pause JOB [--by WHO]             no worker starts one (within a second); resume undoes

Each command boots a context without the database, does one thing and says what it did in a
line per job. A name the config does not have, or an id in two jobs, is a ConfigError (exit 2,
before any server is reached for a name); an operation that cannot be done (no job has the id,
a job that keeps no status records) is a MegaError (exit 1).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from mega.config import Config
from mega.context import Context
from mega.errors import ConfigError, MegaError
from mega.jobs.queue import JobQueue
from mega.jobs.spec import JobBase
from mega.jobs.workflow_records import WorkflowStatus
from mega.lanes.control import Pause
from mega.lanes.records import JobStatus
from mega.runtime.bootstrap import boot, shutdown
from mega.runtime.cli_audit import audited, default_by
from mega.runtime.dlq_cli import select_jobs

JOB_ACTIONS = ("stats", "inspect", "cancel", "retry", "pause", "resume")
# What `cancel` says of a job that had ended already, by its state.
ENDED = {"done": "already done", "dlq": "already dead-lettered", "cancelled": "already cancelled"}


async def run_jobs_command(
    config: Config,
    action: str,
    *,
    target: str | None,
    job: str | None,
    by: str | None,
    as_json: bool = False,
) -> None:
    """Run one `mega jobs` action. `target` is the ID (inspect, cancel, retry) or the JOB
    (pause, resume); `job` is `--job`."""
    if action in ("pause", "resume"):
        jobs = select_jobs(config, target, given="JOB")
    else:
        jobs = select_jobs(config, job)
    if action == "stats" and not jobs:
        print(f"{config.path.name} lists no jobs")
        return
    ctx = await boot(config, role="control", database=False)
    try:
        await jobs_command(
            ctx, jobs, action, target=target or "", by=by, as_json=as_json, named=job is not None
        )
    finally:
        await shutdown(ctx)


async def jobs_command(
    ctx: Context,
    jobs: list[type[JobBase]],
    action: str,
    *,
    target: str,
    by: str | None,
    as_json: bool = False,
    named: bool = False,
) -> None:
    """One `mega jobs` action on `jobs` over `ctx`'s buses (what the command runs once booted).
    `named`: the job was named with --job, so `cancel` cancels the id there even before its
    record exists; else it cancels the one job whose record has the id."""
    queues = {bus: JobQueue(ctx, bus) for bus in {job_cls.bus for job_cls in jobs}}
    pairs = [(queues[job_cls.bus], job_cls) for job_cls in jobs]
    if action == "stats":
        for queue, job_cls in pairs:
            await _stats(queue, job_cls, as_json)
    elif action == "inspect":
        try:
            statuses = await _find(pairs, target)
        except MegaError:
            workflow = await _find_workflow(list(queues.values()), target)
            if workflow is None:
                raise
            data = workflow.model_dump(mode="json")
            print(json.dumps(data, separators=(",", ":")) if as_json else _workflow_text(data))
            return
        for *_, status in statuses:
            data = status.model_dump(mode="json")
            print(json.dumps(data, separators=(",", ":")) if as_json else _status_text(data))
    elif action == "cancel":
        found = [(*pairs[0], None)] if named else await _find(pairs, target, searched=True)
        if len(found) > 1:
            names = " and ".join(job_cls.name for _, job_cls, _ in found)
            raise ConfigError(f"id {target!r} is in {names}: name one with --job")
        [(queue, job_cls, _)] = found
        answer = await queue.cancel(job_cls, target)
        ended = ENDED.get(answer.state, f"already {answer.state}")
        done = "cancelled" if answer.cancelled else f"{ended}, nothing cancelled"
        print(f"{job_cls.name} {target}: {done}")
        await audited(ctx, "cancel", f"job:{job_cls.name}", [target], done)
    elif action == "retry":
        for job_cls in await _retry(pairs, target):
            await audited(ctx, "retry", f"job:{job_cls.name}", [target])
    else:
        who = by if by is not None else default_by()
        [(queue, job_cls)] = pairs
        change = queue.pause if action == "pause" else queue.resume
        record = await change(job_cls, by=who)
        print(f"{job_cls.name}: {action}d by {record.by}")
        await audited(ctx, action, f"job:{job_cls.name}")


async def _stats(queue: JobQueue, job_cls: type[JobBase], as_json: bool) -> None:
    stats = await queue.stats(job_cls)
    # A job that keeps no status records has no pause record either: it cannot be paused.
    recorded = queue.spec(job_cls).keep_status_s > 0
    pause = await queue.paused(job_cls) if recorded else Pause(False)
    if as_json:
        paused: dict[str, Any] = {"paused": pause.paused, "paused_by": None, "paused_at_ms": None}
        if pause.paused:
            paused.update(paused_by=pause.by, paused_at_ms=pause.at_ms)
        line = {
            "job": job_cls.name,
            "pending": stats.pending,
            "in_flight": stats.in_flight,
            "dlq": stats.dlq,
            "approximate": stats.approximate,
            **paused,
        }
        print(json.dumps(line, separators=(",", ":")))
        return
    about = "about " if stats.approximate else ""  # a deep queue's estimate (LaneStats)
    print(
        f"{job_cls.name}: {about}{stats.pending} pending, {stats.in_flight} in flight, {stats.dlq} "
        f"dead letter(s), {pause_text(pause.paused, pause.at_ms, pause.by)}"
    )


async def _find(
    pairs: list[tuple[JobQueue, type[JobBase]]], job_id: str, *, searched: bool = False
) -> list[tuple[JobQueue, type[JobBase], JobStatus]]:
    """The jobs that have a status record for `job_id`, with it; MegaError when none has
    (`searched`: for a cancel that looked through the jobs, which --job would not need)."""
    found = []
    for queue, job_cls in pairs:
        if queue.spec(job_cls).keep_status_s <= 0:
            continue  # keeps no records: nothing to find
        status = await queue.status(job_cls, job_id)
        if status is not None:
            found.append((queue, job_cls, status))
    if not found:
        names = ", ".join(job_cls.name for _, job_cls in pairs) or "no job (the config lists none)"
        hint = " (name its job with --job to cancel it all the same)" if searched else ""
        raise MegaError(
            f"no job with id {job_id!r} in {names}: unknown, or its status record is older than "
            f"the job's keep_status_s{hint}"
        )
    return found


async def _find_workflow(queues: list[JobQueue], workflow_id: str) -> WorkflowStatus | None:
    """The workflow of this id on the first of the buses that has it."""
    for queue in queues:
        status = await queue.status(workflow_id)
        if status is not None:
            return status
    return None


def _workflow_text(data: dict[str, Any]) -> str:
    """`workflow 7f3a: done (group of 5)`, then a line per step and the callback."""
    lines = [f"workflow {data['id']}: {data['state']} ({data['kind']} of {len(data['steps'])})"]
    steps = [(str(n + 1), step) for n, step in enumerate(data["steps"])]
    if data.get("then"):
        steps.append(("then", data["then"]))
    for place, step in steps:
        error = step.get("error")
        detail = f" {error['type']}: {error['message']}" if error else ""
        lines.append(f"  {place} {step['job']} {step['id']}: {step['state']}{detail}")
    return "\n".join(lines)


async def _retry(pairs: list[tuple[JobQueue, type[JobBase]]], job_id: str) -> list[type[JobBase]]:
    """Requeue the dead letters of `job_id`; the jobs that had one."""
    total, requeued = 0, []
    for queue, job_cls in pairs:
        count = await queue.dlq.requeue(job_cls, job_id)
        if count:
            records = f" ({count} records)" if count > 1 else ""
            print(f"{job_cls.name} {job_id}: requeued{records}")
            requeued.append(job_cls)
        total += count
    if total == 0:
        names = ", ".join(job_cls.name for _, job_cls in pairs) or "no job (the config lists none)"
        listing = "mega dlq list" + (f" --job {pairs[0][1].name}" if len(pairs) == 1 else "")
        raise MegaError(f"no dead letter with id {job_id!r} in {names} (`{listing}` shows the ids)")
    return requeued


def _status_text(data: dict[str, Any]) -> str:
    """`EmailJob 4f2a: done`, then a line per field the record has, times in UTC."""
    lines = [f"{data['job']} {data['id']}: {data['state']}"]
    for field in ("attempts", "enqueued_at", "due_at", "started_at", "finished_at", "worker"):
        value = data.get(field)
        if value is not None:
            shown = when(value) if field.endswith("_at") else value
            lines.append(f"  {field.replace('_', ' ')}: {shown}")
    if data.get("error"):
        lines.append(f"  error: {data['error']['type']}: {data['error']['message']}")
    if data.get("result_kept"):
        lines.append("  result: kept (queue.result reads it)")
    for attempt in data.get("history", ()):
        lines.append(f"  attempt {attempt['attempt']}: {_attempt_text(attempt)}")
    if data.get("requeues"):
        lines.append(f"  requeued from the DLQ: {data['requeues']} time(s), after:")
        for attempt in data.get("before_requeue", ()):
            lines.append(f"    attempt {attempt['attempt']}: {_attempt_text(attempt)}")
    return "\n".join(lines)


def _attempt_text(attempt: dict[str, Any]) -> str:
    """`retrying on worker@host:12:ab (RuntimeError: boom)`."""
    text = str(attempt["state"])
    if attempt.get("worker"):
        text += f" on {attempt['worker']}"
    if attempt.get("error"):
        text += f" ({attempt['error']['type']}: {attempt['error']['message']})"
    return text


def pause_text(paused: bool, at_ms: int | None, by: str | None) -> str:
    if not paused:
        return "not paused"
    since = f" since {when(at_ms)}" if at_ms is not None else ""
    return f"paused by {by or '?'}{since}"


def when(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")
