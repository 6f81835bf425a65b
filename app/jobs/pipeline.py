"""The pipeline demo's jobs: a photo is resized to a few sizes at once (ResizeJob, one member
of a group per size), then published once with every rendition (PublishJob, the group's
callback), whatever became of each:

    fan = group([ResizeJob.step({"photo": p, "size": s}) for s in SIZES[:members]])
    await fan.then(PublishJob.step({"photo": p})).enqueue(ctx, id=p)

A member given `fail` ends in the DLQ at once (`Permanent`: a corrupt image does not get
better on a retry); the callback still runs, and receives its error among the outcomes. See
app/services/pipeline.py for the start and what the page reads back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from app.replicas import REPLICAS
from mega import Job, JobContext, Permanent

SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192)  # px, the long side
RESIZE_S = 0.4  # a 64 px rendition's pretend work; each size up takes a little longer
KEEP_S = 3600  # how long a run's figures are kept


def runs_key(photo: str) -> str:
    """How many times the photo's PublishJob ran (the page shows it is once)."""
    return f"demo:pipeline:{photo}:runs"


def received_key(photo: str) -> str:
    """The outcomes the photo's PublishJob received, as JSON."""
    return f"demo:pipeline:{photo}:received"


class ResizeJob(Job):
    subject = "demo.resize"
    bus = "jobs"
    concurrency = 4  # across all worker processes on NATS: a group of 8 runs in two waves
    retries = 1
    backoff = {"type": "exponential", "initial": 200, "max": 1000}
    replicas = REPLICAS

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        size = int(payload["size"])
        await asyncio.sleep(RESIZE_S * (1 + SIZES.index(size) / 8))
        if payload.get("fail"):
            raise Permanent(f"cannot resize {payload['photo']} to {size} px: the image is corrupt")
        return {"size": size, "url": f"/photos/{payload['photo']}/{size}.webp"}


class PublishJob(Job):
    subject = "demo.publish"
    bus = "jobs"
    retries = 2
    replicas = REPLICAS

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        photo, outcomes = payload["photo"], payload["outcomes"]
        async with ctx.cache("main").native.pipeline(transaction=False) as pipe:
            pipe.incr(runs_key(photo))
            pipe.expire(runs_key(photo), KEEP_S)
            pipe.set(received_key(photo), json.dumps(outcomes), ex=KEEP_S)
            await pipe.execute()
        published = [o["result"]["size"] for o in outcomes if o["state"] == "done"]
        return {"published": published, "missing": len(outcomes) - len(published)}
