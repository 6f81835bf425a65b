"""A config as an older release of the sample had it: EmailJob with other limits.

    .venv/bin/mega worker --config docs/guide/examples/old_limits.py --apply-limits

Its EmailJob has the same subject as today's (so the same stream and the same shared consumer)
but `concurrency = 1` and a 30 s ack wait. A worker of this release started with
`--apply-limits` gives the consumer those limits; a worker of today's release then reports the
difference and keeps them, until it too is started with `--apply-limits` (the operating
chapter's "Limits that differ").
"""

import os

from app.jobs.email import EmailJob as TodaysEmailJob


class EmailJob(TodaysEmailJob):
    concurrency = 1
    ack_wait_s = 30.0


services = {
    "caches": {"main": {"driver": "redis", "url": os.environ.get("REDIS_URL", "")}},
    "buses": {"jobs": {"driver": "nats", "url": os.environ.get("NATS_URL", "")}},
}
jobs = [EmailJob]
