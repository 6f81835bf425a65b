"""The three listener groups of UserSignedUp. Each hears every signup; each does its own thing.

    WelcomeEmailListener  an event starts a job: enqueues an EmailJob to the new address
    SignupStatsListener   counts signups per e-mail domain in Redis, once per event id
    CrmSyncListener       a pretend CRM that rejects addresses starting with "fail":
                          retried with backoff, then the group's dead-letter queue

Delivery is at-least-once, so each is idempotent in its own way: the welcome job's id is derived
from the event id (a second enqueue is a duplicate JetStream drops) and the group keeps an
inbox; the stats count under a set of counted event ids, in one Lua script.
"""

from __future__ import annotations

from typing import Any

from app.events.signups import UserSignedUp
from app.jobs.email import EmailJob
from app.replicas import REPLICAS
from app.services import job_timeline
from mega import Context, JobQueue, Listener, ReceivedEvent

# Signups per domain, and the event ids already counted (so a redelivery counts nothing).
STATS_KEY = "demo:signups:domains"
COUNTED_KEY = "demo:signups:counted"
COUNT_ONCE = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  return 1
end
return 0
"""


class CrmRejected(RuntimeError):
    """The pretend CRM's refusal (addresses whose local part starts with "fail")."""


class WelcomeEmailListener(Listener):
    event = UserSignedUp
    replicas = REPLICAS
    inbox = "main"  # skip an event this group already completed, even after the dedup window
    retries = 2
    backoff = {"type": "exponential", "initial": 200, "max": 1000}

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        job_id = "w" + event.id[:11]  # one welcome job per event: a second enqueue dedups
        email = event.data["email"]
        redis = ctx.cache("main").native
        await job_timeline.record_enqueued(redis, job_id, email, "ok")
        await welcome_queue(ctx).enqueue(
            EmailJob, {"id": job_id, "to": email, "mode": "ok"}, id=job_id
        )


class SignupStatsListener(Listener):
    event = UserSignedUp
    replicas = REPLICAS
    concurrency = 4

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        domain = str(event.data["email"]).rsplit("@", 1)[-1].lower()
        redis = ctx.cache("main").native
        await redis.eval(COUNT_ONCE, 2, COUNTED_KEY, STATS_KEY, event.id, domain)


class CrmSyncListener(Listener):
    event = UserSignedUp
    replicas = REPLICAS
    inbox = "main"
    retries = 2
    backoff = {"type": "exponential", "initial": 200, "max": 1000}

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        email = str(event.data["email"])
        if email.split("@", 1)[0].lower().startswith("fail"):
            raise CrmRejected(f"the CRM rejected {email}")


LISTENERS: list[type[Listener]] = [WelcomeEmailListener, SignupStatsListener, CrmSyncListener]


def welcome_queue(ctx: Context) -> JobQueue:
    """One JobQueue per process for the welcome jobs (made on first use)."""
    queue: Any = ctx.extras.get("welcome_queue")
    if queue is None:
        queue = ctx.extras["welcome_queue"] = JobQueue(ctx, "jobs")
    return queue  # type: ignore[no-any-return]
