"""Three real `mega scheduler` processes share one `* * * * * *` schedule: each tick runs once.

Then the winner of the latest tick is killed with SIGKILL and the others carry on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
import redis

from tests.factories import write_config

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = """
from tests.app.cluster_schedules import EverySecond
schedules = [EverySecond]
"""

pytestmark = pytest.mark.slow


def start_scheduler(config: Path, prefix: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mega", "scheduler", "--config", str(config)],
            cwd=ROOT, env={**os.environ, "CLUSTER_PREFIX": prefix}, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def runs_by_instant(client: redis.Redis, prefix: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.hgetall(f"{prefix}:runs").items()}


def test_each_tick_runs_exactly_once_across_three_schedulers_and_survives_a_kill(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=REGISTRATION)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(3):  # started at different moments, as real deployments are
            processes.append(start_scheduler(config, prefix, tmp_path / f"s{n}.log"))
            time.sleep(0.45)
        time.sleep(16)

        runs = runs_by_instant(client, prefix)
        assert len(runs) >= 15
        assert set(runs.values()) == {1}, f"a tick ran twice: {runs}"
        first, last = min(runs), max(runs)
        assert sorted(runs) == list(range(first, last + 1)), "a tick is missing"

        # The audit names exactly one winner per tick, and the losers as skipped.
        winners = client.hgetall(f"{prefix}:winner")
        assert len({winners[str(t)] for t in runs}) >= 1
        audit = [__import__("json").loads(r) for r in client.lrange(f"{prefix}:lock:audit", 0, -1)]
        for instant in list(runs)[-5:]:
            records = [
                r for r in audit if _epoch(r["instant"]) == instant and r["source"] == "schedule"
            ]
            assert [r["outcome"] for r in records].count("ran") == 1
            assert [r["outcome"] for r in records].count("skipped") == 2

        # Kill the winner of the latest tick; the others take over with no gap of two ticks.
        victim_id = winners[str(max(runs))]
        victim = next(p for p in processes if f":{p.pid}:" in victim_id)
        killed_at = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        time.sleep(5)
        after = sorted(t for t in runs_by_instant(client, prefix) if t > killed_at)
        assert len(after) >= 4
        assert all(b - a == 1 for a, b in pairwise(after)), after
        assert after[0] - int(killed_at) <= 2
        assert set(runs_by_instant(client, prefix).values()) == {1}
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                assert process.wait(15) in (0, -signal.SIGKILL)
            except subprocess.TimeoutExpired:
                process.kill()
        client.close()


def _epoch(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso).timestamp())
