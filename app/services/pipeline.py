"""The pipeline demo: a photo resized to `members` sizes at once, then published once with
every outcome (app/jobs/pipeline.py). `start` enqueues the workflow, `read` says where it is:
the workflow's state, each member's, the callback's runs and what it received.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from app.jobs.pipeline import SIZES, PublishJob, ResizeJob, received_key, runs_key
from mega import Context, JobQueue, group

MAX_MEMBERS = len(SIZES)


def failing(members: int) -> int:
    """The member that fails when the run asks for one: the middle size."""
    return members // 2


async def start(ctx: Context, members: int, fail: bool) -> str:
    """Enqueue one run; its id (the workflow's, and the photo's name)."""
    photo = "pl" + uuid.uuid4().hex[:10]
    steps = [
        ResizeJob.step({"photo": photo, "size": size, "fail": fail and n == failing(members)})
        for n, size in enumerate(SIZES[:members])
    ]
    return await group(steps).then(PublishJob.step({"photo": photo})).enqueue(ctx, id=photo)


async def read(queue: JobQueue, redis: Any, photo: str) -> dict[str, Any] | None:
    """The run now, or None for an unknown (or expired) one."""
    status = await queue.status(photo)
    if status is None:
        return None
    runs, received = await redis.mget(runs_key(photo), received_key(photo))
    assert status.then is not None
    members = [
        {
            "size": SIZES[n],
            "state": step.state,
            "attempts": step.attempts,
            "result": step.result,
            "error": None if step.error is None else step.error.message,
        }
        for n, step in enumerate(status.steps)
    ]
    return {
        "id": photo,
        "state": status.state,
        "members": members,
        "callback": {"state": status.then.state, "result": status.then.result},
        "callback_runs": int(runs or 0),
        "results": None if received is None else json.loads(received),
    }
