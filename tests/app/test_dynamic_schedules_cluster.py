"""Two real `mega scheduler` processes and a dynamic entry added, changed and removed with
`mega schedules`: each of its instants runs once across both, on the cron of the moment, and
none after its remove, while the class's own cron keeps ticking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.app.test_scheduler_cluster import (
    REGISTRATION,
    ROOT,
    runs_by_instant,
    start_scheduler,
    stop_schedulers,
)
from tests.factories import write_config

pytestmark = pytest.mark.slow


def entry_runs(client: redis.Redis, prefix: str, key: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.hgetall(f"{prefix}:runs:{key}").items()}


def until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not in {timeout_s} s: {what}"
        time.sleep(0.1)


def schedules(config: Path, prefix: str, *args: str) -> str:
    """`mega schedules ...` as an operator runs it; its one line of output."""
    done = subprocess.run(
        [sys.executable, "-m", "mega", "schedules", *args, "--config", str(config)],
        cwd=ROOT,
        env={**os.environ, "CLUSTER_PREFIX": prefix},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    return done.stdout


def test_a_dynamic_entry_runs_once_per_tick_follows_its_change_and_stops_at_its_remove(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=REGISTRATION)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    logs = [tmp_path / "s0.log", tmp_path / "s1.log"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            processes.append(start_scheduler(config, prefix, log))
            time.sleep(0.45)  # started at different moments, as real deployments are
        until(lambda: len(runs_by_instant(client, prefix)) >= 2, "the class's own ticks")

        added = schedules(
            config,
            prefix,
            "add",
            "EverySecond",
            "--key",
            "acme",
            "--cron",
            "* * * * * *",
            "--args",
            '{"tenant": "acme"}',
            "--by",
            "ops",
        )
        assert added.startswith("EverySecond acme: added by ops, '* * * * * *' in UTC, next ")
        until(lambda: len(entry_runs(client, prefix, "acme")) >= 6, "six ticks of acme")

        asked_at = time.time()  # the change is written some time after this, before changed_at
        changed = schedules(
            config,
            prefix,
            "add",
            "EverySecond",
            "--key",
            "acme",
            "--cron",
            "*/2 * * * * *",
            "--args",
            '{"tenant": "acme", "every": 2}',
            "--by",
            "ops",
        )
        changed_at = time.time()
        assert changed.startswith("EverySecond acme: changed by ops, '*/2 * * * * *' in UTC")
        until(
            lambda: sum(t > changed_at + 2 for t in entry_runs(client, prefix, "acme")) >= 4,
            "four ticks of acme on the new cron",
        )

        listed = schedules(config, prefix, "list")
        assert "\n  acme: '*/2 * * * * *' in UTC, next " in listed, listed
        assert schedules(
            config, prefix, "remove", "EverySecond", "--key", "acme", "--by", "ops"
        ) == ("EverySecond acme: removed by ops\n")
        removed_at = time.time()
        until(
            lambda: max(runs_by_instant(client, prefix)) >= removed_at + 5,
            "five seconds of the class's own ticks after the remove",
        )
        assert all(p.poll() is None for p in processes), "a scheduler exited"
    finally:
        stop_schedulers(processes)
    acme = entry_runs(client, prefix, "acme")
    args = {int(k): json.loads(v) for k, v in client.hgetall(f"{prefix}:args:acme").items()}
    own = runs_by_instant(client, prefix)
    audit = [json.loads(r) for r in client.lrange(f"{prefix}:lock:audit", 0, -1)]
    client.close()

    assert set(acme.values()) == {1}, f"a tick of acme ran twice: {acme}"
    assert set(own.values()) == {1}, f"a tick of the class ran twice: {own}"
    assert sorted(own) == list(range(min(own), max(own) + 1)), "a tick of the class is missing"
    every_second = sorted(t for t in acme if t < changed_at)
    assert len(every_second) >= 6
    assert every_second == list(range(every_second[0], every_second[-1] + 1)), every_second
    # A run reads its entry's args when it starts: a tick of the second before the command
    # (runs start within it) cannot have read the change, a later one may have.
    assert all(args[t] == {"tenant": "acme"} for t in every_second if t < asked_at - 1)
    assert any(t < asked_at - 1 for t in every_second)
    # Within about a second of the change, the new cron: even seconds, none missing.
    every_other = sorted(t for t in acme if t > changed_at + 1.5)
    assert len(every_other) >= 4
    assert every_other == list(range(every_other[0], every_other[-1] + 1, 2)), every_other
    assert every_other[0] % 2 == 0
    assert all(args[t] == {"tenant": "acme", "every": 2} for t in every_other)
    # Nothing after the remove, but what a scheduler had claimed in the second of the poll.
    assert max(acme) <= removed_at + 1.5, (max(acme), removed_at)

    changes = [(r["source"], r["key"], r["reason"]) for r in audit if r["source"] != "schedule"]
    assert changes == [
        ("remove", "acme", "removed by ops"),
        ("change", "acme", "changed by ops: '*/2 * * * * *' in the class zone"),
        ("add", "acme", "added by ops: '* * * * * *' in the class zone"),
    ]
    ran = [r for r in audit if r.get("key") == "acme" and r["outcome"] == "ran"]
    assert len(ran) == len(acme)
    for log in logs:
        text = log.read_text()
        assert "Traceback" not in text, text
        assert "schedule=EverySecond key=acme" in text, text
