"""`mega dlq list|requeue|purge`: the dead-letter tools from a terminal.

mega dlq list                      newest records of every job in the config
mega dlq list --job EmailJob       one job's records (--json: one JSON object per line)
mega dlq requeue --job EmailJob --id 4f2a...   one record back onto the queue
mega dlq requeue --job EmailJob --all          every record of that job
mega dlq purge --job EmailJob      delete them all

A requeue without `--id` or `--all` is refused and says how many records it would replay: a
DLQ often holds a record that fails for a reason nobody has fixed yet (a `WorkerCrashed` one
kills its worker on every attempt), and replaying it with the rest should be a decision.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from mega.config import Config
from mega.errors import ConfigError
from mega.jobs.queue import JobQueue
from mega.jobs.spec import JobBase
from mega.runtime.bootstrap import boot, shutdown
from mega.runtime.cli_audit import audited


async def run_dlq_command(
    config: Config,
    action: str,
    *,
    job: str | None,
    job_id: str | None,
    limit: int,
    replay_all: bool = False,
    as_json: bool = False,
) -> None:
    """Run one `mega dlq` action. `replay_all` is `--all` (requeue only, instead of `--id`),
    `as_json` is `--json` (list only); a refused combination raises ConfigError (exit 2)."""
    jobs = select_jobs(config, job)
    if action == "purge" and job is None:
        raise ConfigError("purge: name the job with --job (purging every DLQ at once is refused)")
    if job_id is not None and action != "requeue":
        raise ConfigError("--id goes with requeue only")
    if replay_all and action != "requeue":
        raise ConfigError("--all goes with requeue only")
    if replay_all and job_id is not None:
        raise ConfigError("requeue: pass --id ID for one record or --all for every one, not both")
    if as_json and action != "list":
        raise ConfigError("--json goes with list only")
    ctx = await boot(config, role="dlq", database=False)
    try:
        queues = {bus: JobQueue(ctx, bus) for bus in {job_cls.bus for job_cls in jobs}}
        if action == "requeue" and job_id is None and not replay_all:
            counts = [(job_cls, await queues[job_cls.bus].dlq.count(job_cls)) for job_cls in jobs]
            raise ConfigError(_requeue_refusal(counts, job))
        for job_cls in jobs:
            dlq = queues[job_cls.bus].dlq
            if action == "list":
                await (_list_json if as_json else _list)(queues[job_cls.bus], job_cls, limit)
            elif action == "requeue":
                count = await (dlq.requeue(job_cls, job_id) if job_id else dlq.requeue_all(job_cls))
                print(f"{job_cls.name}: requeued {count} job(s)")
                what = "requeue" if job_id else "requeue all"
                ids = [job_id] if job_id else []
                await audited(ctx, what, f"job:{job_cls.name}", ids, f"{count} job(s)")
            else:
                count = await dlq.purge(job_cls)
                print(f"{job_cls.name}: purged {count} record(s)")
                await audited(ctx, "purge", f"job:{job_cls.name}", detail=f"{count} record(s)")
    finally:
        await shutdown(ctx)


def select_jobs(config: Config, name: str | None, *, given: str = "--job") -> list[type[JobBase]]:
    """The job of the config called `name` (its class name or its `name`), or every job when
    `name` is None; ConfigError naming the jobs there are, and where the name was `given`."""
    if name is None:
        return list(config.jobs)
    for job_cls in config.jobs:
        if job_cls.__name__ == name or getattr(job_cls, "name", None) == name:
            return [job_cls]
    known = ", ".join(j.__name__ for j in config.jobs) or "none"
    raise ConfigError(f"{given}: no job named {name!r} in the config (jobs: {known})")


def _requeue_refusal(counts: list[tuple[type[JobBase], int]], job: str | None) -> str:
    """`requeue` without --id or --all: what it would replay, and the two ways on."""
    total = sum(n for _, n in counts)
    letters = f"{total} dead letter{'' if total == 1 else 's'}"
    if len(counts) == 1:
        letters += f" of {counts[0][0].name}"
    elif counts:
        letters += " (" + ", ".join(f"{n} of {job_cls.name}" for job_cls, n in counts) + ")"
    listing = "mega dlq list" + (f" --job {job}" if job else "")
    return (
        f"requeue needs --id or --all: {letters} would be replayed; pass --id ID for one "
        f"(`{listing}` shows the ids) or --all to replay them all"
    )


async def _list(queue: JobQueue, job_cls: type[JobBase], limit: int) -> None:
    dlq = queue.dlq
    count = await dlq.count(job_cls)
    print(f"{job_cls.name}: {count} dead letter(s)")
    for record in await dlq.list(job_cls, limit=limit):
        failed_at = datetime.fromtimestamp(record["failed_at"] / 1000, UTC)
        failed = failed_at.isoformat(timespec="seconds")
        error = f"{record['error']['type']}: {record['error']['message']}"
        print(f"  {record['id']}  {failed}  attempts={record['attempts']}  {error}")
        print(f"    payload {json.dumps(record.get('payload'))[:200]}")


async def _list_json(queue: JobQueue, job_cls: type[JobBase], limit: int) -> None:
    """One record per line (JSON Lines), newest first, each with its job's name: what a script
    reads, e.g. the newest id with `... --limit 1 --json | python -c '...["id"]'`."""
    for record in await queue.dlq.list(job_cls, limit=limit):
        print(json.dumps({"job": job_cls.name, **record}, separators=(",", ":")))
