"""What became of one EmailJob, from a terminal: its status record, its attempts, its result.

    .venv/bin/python docs/guide/examples/job_status.py ID [--wait SECONDS]

It loads mega_config.py, boots a Context and reads the job's status record with
`JobQueue.status` (state, attempts, and the earlier attempts in `history`). With --wait it
waits up to SECONDS for the job to end with `JobQueue.result`: what `run` returned, or the
JobFailed that says how it ended instead (dead-lettered, cancelled). Exits 1 for an unknown id.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the sample's `app` package, as the mega command has it

from app.jobs.email import EmailJob  # noqa: E402
from mega import JobFailed, JobQueue, load_config  # noqa: E402
from mega.runtime import boot, shutdown  # noqa: E402


async def main(job_id: str, wait_s: float | None) -> int:
    config = load_config(ROOT / "mega_config.py", signs=False)  # signs nothing: no secret key
    ctx = await boot(config, role="script", database=False)
    try:
        queue = JobQueue(ctx, EmailJob.bus)
        ending = None
        if wait_s is not None:
            try:
                ending = f"result: {await queue.result(EmailJob, job_id, timeout_s=wait_s)}"
            except JobFailed as exc:
                ending = f"no result: {exc}"
        status = await queue.status(EmailJob, job_id)
        if status is None:
            print(f"no EmailJob {job_id} (or its record has expired)")
            return 1
        print(f"EmailJob {job_id}: {status.state}, {status.attempts} attempt(s)")
        for earlier in status.history:
            error = f" ({earlier.error.type})" if earlier.error else ""
            print(f"  attempt {earlier.attempt}: {earlier.state}{error}")
        if status.error is not None:
            print(f"  error: {status.error.type}: {status.error.message}")
        if ending is not None:
            print(f"  {ending}")
        return 0
    finally:
        await shutdown(ctx)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="An EmailJob's status record and result.")
    parser.add_argument("id")
    parser.add_argument("--wait", type=float, metavar="SECONDS", help="wait for its end")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.id, args.wait)))
