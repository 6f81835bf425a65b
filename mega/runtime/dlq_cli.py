"""`mega dlq list|requeue|purge`: the dead-letter tools from a terminal.

mega dlq list                      newest records of every job in the config
mega dlq list --job EmailJob       one job's records
mega dlq requeue --job EmailJob --id 4f2a...   one record back onto the queue
mega dlq requeue --job EmailJob    every record of that job
mega dlq purge --job EmailJob      delete them all
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from mega.config import Config
from mega.errors import ConfigError
from mega.jobs.job import Job
from mega.jobs.queue import JobQueue
from mega.runtime.boot import boot, shutdown


async def run_dlq_command(
    config: Config, action: str, *, job: str | None, job_id: str | None, limit: int
) -> None:
    jobs = _select(config, job)
    if action == "purge" and job is None:
        raise ConfigError("purge: name the job with --job (purging every DLQ at once is refused)")
    if job_id is not None and action != "requeue":
        raise ConfigError("--id goes with requeue only")
    ctx = await boot(config, role="dlq", database=False)
    try:
        queues: dict[str, JobQueue] = {}
        for job_cls in jobs:
            queue = queues.setdefault(job_cls.bus, JobQueue(ctx, job_cls.bus))
            if action == "list":
                await _list(queue, job_cls, limit)
            elif action == "requeue":
                dlq = queue.dlq
                count = await (dlq.requeue(job_cls, job_id) if job_id else dlq.requeue_all(job_cls))
                print(f"{job_cls.name}: requeued {count} job(s)")
            else:
                print(f"{job_cls.name}: purged {await queue.dlq.purge(job_cls)} record(s)")
    finally:
        await shutdown(ctx)


def _select(config: Config, name: str | None) -> list[type[Job]]:
    if name is None:
        return list(config.jobs)
    for job_cls in config.jobs:
        if job_cls.__name__ == name or getattr(job_cls, "name", None) == name:
            return [job_cls]
    known = ", ".join(j.__name__ for j in config.jobs) or "none"
    raise ConfigError(f"--job: no job named {name!r} in the config (jobs: {known})")


async def _list(queue: JobQueue, job_cls: type[Job], limit: int) -> None:
    dlq = queue.dlq
    count = await dlq.count(job_cls)
    print(f"{job_cls.name}: {count} dead letter(s)")
    for record in await dlq.list(job_cls, limit=limit):
        failed_at = datetime.fromtimestamp(record["failed_at"] / 1000, UTC)
        failed = failed_at.isoformat(timespec="seconds")
        error = f"{record['error']['type']}: {record['error']['message']}"
        print(f"  {record['id']}  {failed}  attempts={record['attempts']}  {error}")
        print(f"    payload {json.dumps(record.get('payload'))[:200]}")
