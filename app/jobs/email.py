"""EmailJob: a pretend email send with six modes, to watch retries, the DLQ, leases and crashes.

    ok         succeeds on the first attempt
    flaky      fails its first attempt, then succeeds (one retry)
    fail       always fails: 3 attempts (retries=2), then a record in the dead-letter queue
    permanent  raises mega.Permanent (the address does not exist, and no retry will make it):
               the retries are skipped, and the job is dead-lettered after its one attempt
    slow       runs SLOW_STEPS steps for 3x its ack wait in all, reporting each with ctx.progress:
               its lease is renewed while it runs (in_progress heartbeats), so no other worker
               gets it although it outlives the ack wait, and it succeeds on attempt 1
    crash      kills its worker process on every attempt, a second in (as a segfault or an OOM
               kill would):
               nothing acks it, so after each `ack_wait_s` another worker gets it, until the
               delivery after the last attempt, which the queue dead-letters as WorkerCrashed

`ctx.attempt` is the queue's count of runs (a requeue from the DLQ starts it again at 1).
Delivery is at-least-once, so a real send would first check a "sent" marker keyed on the id
(see docs/guide/jobs.md, idempotency).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from app.replicas import REPLICAS
from mega import Job, JobContext, Permanent

# The slow mode's steps; together they last SLOW_ACK_WAITS ack waits.
SLOW_STEPS = 6
SLOW_ACK_WAITS = 3


class SimulatedSendError(RuntimeError):
    """The failure the demo modes produce on purpose."""


# A crash job works this long before it kills its worker: its card shows the attempt running.
CRASH_AFTER_S = 1.0


class EmailJob(Job):
    subject = "demo.email"
    bus = "jobs"
    concurrency = 2  # in flight across ALL worker processes (NATS max_ack_pending)
    retries = 2  # three attempts in all
    backoff = {"type": "exponential", "initial": 500, "max": 2000}  # ms, full jitter
    replicas = REPLICAS  # copies of its streams in a NATS cluster (MEGA_REPLICAS)
    # A crashed attempt comes back after this long; a running job renews it every third of it.
    # 5 s: a slow job (3 ack waits) lasts 15 s, a crash job reaches the DLQ about 15 s in.
    ack_wait_s = 5.0
    keep_result_s = 3600  # what run returns: GET /api/demo/jobs/{id} shows it for an hour

    async def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        attempt, mode = ctx.attempt, payload["mode"]
        if mode == "fail":
            raise SimulatedSendError(f"mailbox {payload['to']} rejected the message")
        if mode == "permanent":
            raise Permanent(f"no mailbox {payload['to']}: the domain says it does not exist")
        if mode == "flaky" and attempt == 1:
            raise SimulatedSendError("SMTP server timed out (first attempt only)")
        if mode == "slow":
            await slow_send(ctx, SLOW_ACK_WAITS * self.ack_wait_s)
        if mode == "crash":
            # Half a send first, as a real crash comes mid-work: its card shows this attempt
            # running on this worker, then dies with it (no ack, no nak, no goodbye).
            await ctx.progress(0.5, "half sent: this worker is about to die")
            await asyncio.sleep(CRASH_AFTER_S)
            os._exit(1)
        return {"sent_to": payload["to"], "attempt": attempt}


async def slow_send(ctx: JobContext, total_s: float) -> None:
    """SLOW_STEPS equal steps over `total_s` seconds, each reported when done."""
    await ctx.progress(0.0, f"0 of {SLOW_STEPS} steps done")
    for step in range(1, SLOW_STEPS + 1):
        await asyncio.sleep(total_s / SLOW_STEPS)
        await ctx.progress(step / SLOW_STEPS, f"{step} of {SLOW_STEPS} steps done")
