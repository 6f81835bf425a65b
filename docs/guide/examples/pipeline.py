"""The sample's pipeline from a terminal: start one, or say where one is.

    .venv/bin/python docs/guide/examples/pipeline.py start [--members N] [--fail]
    .venv/bin/python docs/guide/examples/pipeline.py status ID [--wait SECONDS]

`start` enqueues a group of ResizeJobs (one per size) whose callback is one PublishJob
(app/services/pipeline.py) and prints the workflow's id. `status` reads the workflow with
`JobQueue.status(workflow_id)`: its state, then a line per member and one for the callback;
with --wait it first waits up to SECONDS for the workflow to end. Exits 1 for an unknown id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the sample's `app` package, as the mega command has it

from app.jobs.pipeline import SIZES  # noqa: E402
from app.services import pipeline  # noqa: E402
from mega import JobQueue, WorkflowStep, load_config  # noqa: E402
from mega.runtime import boot, shutdown  # noqa: E402


def line(label: str, step: WorkflowStep) -> str:
    if step.error is not None:
        return f"  {label}: {step.state} {step.error.type}: {step.error.message}"
    result = "" if step.result is None else " " + json.dumps(step.result)
    return f"  {label}: {step.state}{result}"


async def main(args: argparse.Namespace) -> int:
    config = load_config(ROOT / "mega_config.py", signs=False)  # signs nothing: no secret key
    ctx = await boot(config, role="script", database=False)
    try:
        if args.command == "start":
            workflow_id = await pipeline.start(ctx, args.members, args.fail)
            print(f"enqueued workflow {workflow_id} ({args.members} sizes)")
            return 0
        queue = JobQueue(ctx, "jobs")
        deadline = time.monotonic() + (args.wait or 0)
        status = await queue.status(args.id)
        while status is not None and not status.final and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            status = await queue.status(args.id)
        if status is None:
            print(f"no workflow {args.id} (or its records have expired)")
            return 1
        print(f"workflow {status.id}: {status.state} ({status.kind} of {len(status.steps)})")
        for n, step in enumerate(status.steps):
            print(line(f"{n + 1} {step.job} {SIZES[n]} px", step))
        if status.then is not None:
            print(line(f"then {status.then.job}", status.then))
        return 0
    finally:
        await shutdown(ctx)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="enqueue one pipeline, print its id")
    start.add_argument("--members", type=int, default=5, choices=range(1, len(SIZES) + 1))
    start.add_argument("--fail", action="store_true", help="the middle size fails")
    status = commands.add_parser("status", help="where a pipeline is")
    status.add_argument("id")
    status.add_argument("--wait", type=float, help="wait up to this many s for its end")
    sys.exit(asyncio.run(main(parser.parse_args())))
