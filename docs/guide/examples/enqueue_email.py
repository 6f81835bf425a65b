"""Enqueue one EmailJob from a terminal, the way any process of yours would.

    .venv/bin/python docs/guide/examples/enqueue_email.py fail [ada@example.com]

It loads mega_config.py, boots a Context with its services (Redis, the jobs bus) and calls
`JobQueue.enqueue`: the job is stored on the broker before the call returns. It also lists the
job on the demo's page, so with `make run` running (its URLs come from var/dev.env) the job
shows on /demo/jobs. The modes are EmailJob's: ok, flaky, fail, permanent, slow, crash
(app/jobs/email.py).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the sample's `app` package, as the mega command has it

from app.jobs.email import EmailJob  # noqa: E402
from app.services.recent_jobs import remember  # noqa: E402
from mega import JobQueue, load_config  # noqa: E402
from mega.runtime import boot, shutdown  # noqa: E402


async def main(mode: str, to: str) -> None:
    config = load_config(ROOT / "mega_config.py", signs=False)  # signs nothing: no secret key
    ctx = await boot(config, role="script", database=False)
    try:
        job_id = uuid.uuid4().hex[:12]
        await remember(ctx.cache("main").native, job_id, to, mode)
        await JobQueue(ctx, EmailJob.bus).enqueue(
            EmailJob, {"id": job_id, "to": to, "mode": mode}, id=job_id
        )
        print(f"enqueued EmailJob {job_id} (mode {mode}, to {to})")
    finally:
        await shutdown(ctx)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0] if args else "ok", args[1] if len(args) > 1 else "ada@example.com"))
