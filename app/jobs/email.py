"""EmailJob: a pretend email send with three modes, to watch retries and the DLQ at work.

    ok     succeeds on the first attempt
    flaky  fails its first attempt, then succeeds (one retry)
    fail   always fails: 3 attempts (retries=2), then a record in the dead-letter queue

The job counts its own attempts in Redis per job id. Delivery is at-least-once, so a real
send would first check a "sent" marker keyed on the id (see docs/guide/jobs.md, idempotency).
"""

from __future__ import annotations

from typing import Any

from app.replicas import REPLICAS
from app.services.job_timeline import attempts_key
from mega import Context, Job


class SimulatedSendError(RuntimeError):
    """The failure the demo modes produce on purpose."""


class EmailJob(Job):
    subject = "demo.email"
    bus = "jobs"
    concurrency = 2  # in flight across ALL worker processes (NATS max_ack_pending)
    retries = 2  # three attempts in all
    backoff = {"type": "exponential", "initial": 500, "max": 2000}  # ms, full jitter
    replicas = REPLICAS  # copies of its streams in a NATS cluster (MEGA_REPLICAS)

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        redis = ctx.cache("main").native
        attempt = await redis.incr(attempts_key(payload["id"]))
        await redis.expire(attempts_key(payload["id"]), 24 * 3600)
        mode = payload["mode"]
        if mode == "fail":
            raise SimulatedSendError(f"mailbox {payload['to']} rejected the message")
        if mode == "flaky" and attempt == 1:
            raise SimulatedSendError("SMTP server timed out (first attempt only)")
