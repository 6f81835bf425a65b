"""ActivateAccountJob: the signup's own job, written in the signup's transaction with
`outbox.enqueue` (app/services/signups.py), so it exists exactly when the signup commits.

A run marks the account active in Redis (a hash, signup id -> when), which is idempotent: a run
repeated after a crash writes the same field again. Its id is derived from the signup's event
id, so the events page finds its status record without storing anything more.
"""

from __future__ import annotations

import time
from typing import Any

from app.replicas import REPLICAS
from mega import Job, JobContext

# Activated accounts: a hash, signup id -> epoch ms of the activation.
ACTIVATED_KEY = "demo:signups:activated"


def activation_id(event_id: str) -> str:
    """The activation job's id for a signup (its event id's, made distinct)."""
    return "a" + event_id[:11]


class ActivateAccountJob(Job):
    subject = "demo.signup.activate"
    bus = "jobs"
    replicas = REPLICAS
    retries = 2

    async def run(self, payload: Any, ctx: JobContext) -> None:
        redis = ctx.cache("main").native
        await redis.hset(ACTIVATED_KEY, str(payload["signup_id"]), int(time.time() * 1000))
