"""How the pages name a host process: short enough for a phone, with what a learner needs."""

from __future__ import annotations


def short_instance(instance_id: str) -> str:
    """`worker@host:4121:a1b2c3` -> `a1b2c3 (pid 4121)`: the random suffix tells two runs of
    one pid apart, the pid is what to kill; any other form -> its last 12 characters. The jobs
    page, the console and the cron page all name instances this way."""
    _, _, where = instance_id.rpartition("@")
    parts = where.split(":")
    if len(parts) >= 3 and parts[-2].isdigit():
        return f"{parts[-1]} (pid {parts[-2]})"
    return instance_id[-12:]
