"""The four listener groups of UserSignedUp. Each hears every signup; each does its own thing.

    WelcomeEmailListener   an event starts a job: enqueues an EmailJob to the new address
    SignupStatsListener    counts signups per e-mail domain in Redis, once per event id
    WelcomeCreditListener  grants the new user welcome credits, a database row, once per event
    CrmSyncListener        a pretend CRM that rejects addresses starting with "fail":
                           retried with backoff, then the group's dead-letter queue

Delivery is at-least-once, so each is idempotent in its own way: the welcome job's id is derived
from the event id (a second enqueue is a duplicate JetStream drops) and the group keeps an
inbox; the stats count and their inbox mark are one Lua script (`event.inbox.apply`); the credit
row and the inbox mark are one database transaction (`inbox = "db"`, `event.db`).
"""

from __future__ import annotations

from app.events.signups import UserSignedUp
from app.jobs.email import EmailJob
from app.replicas import REPLICAS
from app.services import recent_jobs
from app.services.signups import grant_welcome_credits
from mega import Context, Listener, ReceivedEvent

# Signups per e-mail domain (a hash: domain -> count).
STATS_KEY = "demo:signups:domains"


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
        await recent_jobs.remember(redis, job_id, email, "ok")
        await EmailJob.enqueue(ctx, {"id": job_id, "to": email, "mode": "ok"}, id=job_id)


class SignupStatsListener(Listener):
    event = UserSignedUp
    replicas = REPLICAS
    concurrency = 4
    inbox = "main"  # the count and the inbox mark in one script: counted once per event id

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        domain = str(event.data["email"]).rsplit("@", 1)[-1].lower()
        await event.inbox.apply(event.id, ("HINCRBY", STATS_KEY, domain, 1))


class WelcomeCreditListener(Listener):
    event = UserSignedUp
    replicas = REPLICAS
    inbox = "db"  # the credit row commits with the event id: granted once per event
    retries = 2
    backoff = {"type": "exponential", "initial": 200, "max": 1000}

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        signup_id = int(event.data["signup_id"])
        await event.db.run(lambda session: grant_welcome_credits(session, signup_id, event.id))


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


LISTENERS: list[type[Listener]] = [
    WelcomeEmailListener,
    SignupStatsListener,
    WelcomeCreditListener,
    CrmSyncListener,
]
