"""EmailJob: a pretend email send with five modes, to watch retries, the DLQ and crashes.

    ok     succeeds on the first attempt
    flaky  fails its first attempt, then succeeds (one retry)
    fail   always fails: 3 attempts (retries=2), then a record in the dead-letter queue
    slow   takes SLOW_S seconds: watch it hold one of the two slots while others wait
    crash  kills its worker process on the first attempt (as a segfault or an OOM kill would):
           nothing acks it, so after `ack_wait_s` another worker gets it as attempt 2

The job counts its own attempts in Redis per job id. Delivery is at-least-once, so a real
send would first check a "sent" marker keyed on the id (see docs/guide/jobs.md, idempotency).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from app.replicas import REPLICAS
from app.services.job_timeline import attempts_key
from mega import Context, Job

SLOW_S = 4.0


class SimulatedSendError(RuntimeError):
    """The failure the demo modes produce on purpose."""


class EmailJob(Job):
    subject = "demo.email"
    bus = "jobs"
    concurrency = 2  # in flight across ALL worker processes (NATS max_ack_pending)
    retries = 2  # three attempts in all
    backoff = {"type": "exponential", "initial": 500, "max": 2000}  # ms, full jitter
    replicas = REPLICAS  # copies of its streams in a NATS cluster (MEGA_REPLICAS)
    ack_wait_s = 10.0  # a crashed attempt comes back after this long (running jobs renew it)

    async def run(self, payload: dict[str, Any], ctx: Context) -> None:
        redis = ctx.cache("main").native
        attempt = await redis.incr(attempts_key(payload["id"]))
        await redis.expire(attempts_key(payload["id"]), 24 * 3600)
        mode = payload["mode"]
        if mode == "fail":
            raise SimulatedSendError(f"mailbox {payload['to']} rejected the message")
        if mode == "flaky" and attempt == 1:
            raise SimulatedSendError("SMTP server timed out (first attempt only)")
        if mode == "slow":
            await asyncio.sleep(SLOW_S)
        if mode == "crash" and attempt == 1:
            os._exit(1)  # no ack, no nak, no goodbye: the worker process is gone
