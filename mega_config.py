"""The sample application's config: what runs where, and which services it talks to.

Plain Python, read by every `mega` command (`--config` or MEGA_CONFIG to use another file).
URLs and secrets come from the environment; the defaults suit `mega dev` on a laptop.

    REDIS_URL        redis://127.0.0.1:6379/0   (per alias: REDIS_<ALIAS>_URL, e.g. REDIS_MAIN_URL)
    NATS_URL         nats://127.0.0.1:4222      (per alias: NATS_<ALIAS>_URL, e.g. NATS_JOBS_URL)
    DATABASE_URL     sqlite:///./var/mega.db    (postgresql://user:pass@host/db for PostgreSQL)
    MEGA_SECRET_KEY  required outside `mega dev` (32+ random characters)
    MEGA_DEMO_USER / MEGA_DEMO_PASSWORD   the login to create at start (dev: demo / demo)
    MEGA_BUS         nats (default), redis or postgres: the driver of the jobs and events bus
                     (`make run BUS=redis`: on REDIS_URL; `make run BUS=postgres`: in the
                     application's database, DATABASE_URL, which `mega dev` then starts)
    NATS_URL         several URLs joined by commas for a NATS cluster, with
    MEGA_REPLICAS    copies of each stream (3 in compose's cluster profile; default 1)
    MEGA_DEMO_CRON   the demo schedule's cron (default "*/30 * * * * *": every 30 s)
"""

import os

from app.events.listeners import LISTENERS
from app.events.relay_switch import relay_paused
from app.events.signups import UserSignedUp
from app.events.status import attach_event_status
from app.jobs.email import EmailJob
from app.jobs.observers import attach_job_observers
from app.jobs.pipeline import PublishJob, ResizeJob
from app.jobs.signup import ActivateAccountJob
from app.jobs.tenant import FairTenantJob, LimitedTenantJob, TenantJob
from app.replicas import REPLICAS
from app.schedules.cron_counter import CronCounterSchedule
from app.workers.hash_worker import HashWorker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
BUS = os.environ.get("MEGA_BUS") or "nats"
BUSES = {
    "nats": {
        "driver": "nats",
        "url": os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
        "replicas": REPLICAS,  # the events stream's
    },
    "redis": {"driver": "redis", "url": REDIS_URL},
    "postgres": {"driver": "postgres"},  # no URL: the application's database
}
if BUS not in BUSES:
    raise ValueError(f"MEGA_BUS: 'nats', 'redis' or 'postgres', got {BUS!r}")

services = {
    "caches": {
        "main": {"driver": "redis", "url": REDIS_URL},
    },
    "locks": {
        # One Redis is the default; list several independent caches for a quorum (scale-out).
        "main": {"driver": "redlock", "caches": ["main"]},
    },
    "buses": {
        "jobs": BUSES[BUS],
    },
    "database": {"url": os.environ.get("DATABASE_URL")},
}

schedules = [CronCounterSchedule]
jobs = [
    EmailJob,
    TenantJob,
    FairTenantJob,
    LimitedTenantJob,
    ActivateAccountJob,
    ResizeJob,
    PublishJob,
]
workers = [HashWorker]
# Events the app emits (the outbox's rows), and the listener groups `mega worker` runs.
events = [UserSignedUp]
listeners = LISTENERS
# The relay in each `mega worker`: the demo's pause switch lets the outbox pile up.
outbox = {"paused": relay_paused}

web_app = "app.web:create_app"

# Called once per host as hook(runtime, ctx): the job worker's signals feed the progress bars
# of /demo/jobs and the console's charts, the listener groups' signals the statuses of
# /demo/events.
hooks = {"worker": [attach_job_observers], "listeners": [attach_event_status]}

# The demo's login: MEGA_DEMO_USER / MEGA_DEMO_PASSWORD, or demo / demo under `mega dev` only.
DEV = os.environ.get("MEGA_ENV") == "dev"
demo_user = os.environ.get("MEGA_DEMO_USER") or ("demo" if DEV else "")
demo_password = os.environ.get("MEGA_DEMO_PASSWORD") or ("demo" if DEV else "")

auth = {
    "session_max_age_s": 8 * 3600,
    "login_max_failures": 5,  # per (username, IP); per IP: login_ip_max_failures (50)
    "login_window_s": 15 * 60,
    "landing_path": "/demo",  # where a login lands when no page sent it
    # Created (or their password reset) when the web app starts.
    "users": {demo_user: demo_password} if demo_user and demo_password else {},
    # The console's access levels (viewer, operator, admin); a user not named is a viewer.
    "roles": {demo_user: "admin"} if demo_user else {},
}

# Prometheus: scheduler and worker hosts listen on their own ports (MEGA_METRICS_BIND: which
# address; compose publishes neither, so only its own network reaches them). The web app's port
# is public, so it serves /metrics only behind MEGA_METRICS_TOKEN (a scrape sends it as a bearer
# token), or under `mega dev`, which listens on this machine alone.
metrics = {
    "enabled": True,
    "web": DEV or bool(os.environ.get("MEGA_METRICS_TOKEN")),
    "scheduler_port": int(os.environ.get("MEGA_SCHEDULER_METRICS_PORT", "9101")),
    "worker_port": int(os.environ.get("MEGA_WORKER_METRICS_PORT", "9102")),
}
