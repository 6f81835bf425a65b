"""Three real `mega scheduler` processes share one `* * * * * *` schedule: each tick runs once.

Then the winner of the latest tick is killed with SIGKILL and the others carry on. With clocks
1.5 s apart (libfaketime), each tick still runs once, and never before its instant in real time."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import cast

import pytest
import redis

from mega.drivers.embedded import free_port
from mega.schedules.locks import CLAIM_TOLERANCE_MS
from tests.app.test_host_metrics import Host, scrape
from tests.app.test_web_metrics import sample
from tests.factories import write_config
from tests.processes import clock_offset_env

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = """
from tests.app.cluster_schedules import EverySecond
schedules = [EverySecond]
"""

pytestmark = pytest.mark.slow


def start_scheduler(
    config: Path, prefix: str, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mega", "scheduler", "--config", str(config)],
            cwd=ROOT,
            env={**os.environ, "CLUSTER_PREFIX": prefix, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_schedulers(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every scheduler still running; each exits 0 (or was SIGKILLed by the test)."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            assert process.wait(15) in (0, -signal.SIGKILL)
        except subprocess.TimeoutExpired:
            process.kill()


def runs_by_instant(client: redis.Redis, prefix: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.hgetall(f"{prefix}:runs").items()}


def early_runs(client: redis.Redis, prefix: str) -> dict[int, float]:
    """The runs that started before their instant by more than the claim's tolerance: ms
    before it, by instant. Measured on Redis's clock, which no test fakes."""
    started_us = {int(k): int(v) for k, v in client.hgetall(f"{prefix}:started_us").items()}
    before_ms = {t: (t * 1_000_000 - us) / 1000 for t, us in started_us.items()}
    return {t: ms for t, ms in before_ms.items() if ms > CLAIM_TOLERANCE_MS}


def names_one_of(winner: str | None, pids: set[int]) -> bool:
    """Whether a tick's winner (`scheduler@host:<pid>:<id>`) is one of the processes `pids`."""
    return winner is not None and any(f":{pid}:" in winner for pid in pids)


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
        # 15 instants run (16 s on a quiet machine; the three starts take longer while the
        # suite runs): polled, with a deadline.
        deadline = time.monotonic() + 60
        while len(runs := runs_by_instant(client, prefix)) < 15:
            assert time.monotonic() < deadline, f"15 instants not run in 60 s: {runs}"
            time.sleep(0.2)
        assert set(runs.values()) == {1}, f"a tick ran twice: {runs}"
        first, last = min(runs), max(runs)
        assert sorted(runs) == list(range(first, last + 1)), "a tick is missing"

        # Each tick names its winner, one of the three; the audit names exactly one winner
        # per tick, and the losers as skipped.
        winners = cast("dict[str, str]", client.hgetall(f"{prefix}:winner"))  # decoded: str
        pids = {process.pid for process in processes}
        unnamed = {
            t: winners.get(str(t)) for t in runs if not names_one_of(winners.get(str(t)), pids)
        }
        assert not unnamed, f"ticks without a winner among the schedulers {pids}: {unnamed}"
        audit = [json.loads(r) for r in client.lrange(f"{prefix}:lock:audit", 0, -1)]
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
        deadline = time.monotonic() + 30
        while len(after := sorted(t for t in runs_by_instant(client, prefix) if t > killed_at)) < 4:
            assert time.monotonic() < deadline, f"4 instants not run after the kill: {after}"
            time.sleep(0.2)
        assert all(b - a == 1 for a, b in pairwise(after)), after
        assert after[0] - int(killed_at) <= 2
        assert set(runs_by_instant(client, prefix).values()) == {1}
    finally:
        stop_schedulers(processes)
        client.close()


def test_skewed_clocks_run_each_instant_once_and_never_before_it(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    """Clocks at 0, +1.5 s and -1.5 s: the fast one wakes 1.5 s early for every tick, and the
    claim makes it wait for the instant on the lock server's clock (here the machine's own)."""
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=REGISTRATION)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    clocks = [{}, clock_offset_env(+1.5), clock_offset_env(-1.5)]
    processes = [
        start_scheduler(config, prefix, tmp_path / f"s{n}.log", env) for n, env in enumerate(clocks)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(runs_by_instant(client, prefix)) < 12:
            assert time.monotonic() < deadline, "fewer than 12 ticks ran in 60 s"
            assert all(p.poll() is None for p in processes), "a scheduler exited"
            time.sleep(0.2)
    finally:
        stop_schedulers(processes)
    runs = runs_by_instant(client, prefix)
    early = early_runs(client, prefix)
    winners = client.hgetall(f"{prefix}:winner")
    client.close()

    assert set(runs.values()) == {1}, f"a tick ran twice: {runs}"
    assert sorted(runs) == list(range(min(runs), max(runs) + 1)), "a tick is missing"
    assert not early, f"runs started this many ms before their instant: {early}; by {winners}"


async def test_a_scheduler_whose_clock_is_ahead_logs_the_offset_once_and_exports_it(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    port = free_port()
    body = REGISTRATION + f'metrics = {{"enabled": True, "scheduler_port": {port}}}\n'
    config = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    log = tmp_path / "scheduler.log"
    process = start_scheduler(config, prefix, log, clock_offset_env(+1.5))
    running = Host(process, log)
    try:
        await scrape(port, running)
        deadline = time.monotonic() + 30
        while len(runs_by_instant(client, prefix)) < 4:
            assert time.monotonic() < deadline, f"fewer than 4 ticks in 30 s\n{log.read_text()}"
            await asyncio.sleep(0.2)
        text = await scrape(port, running)
    finally:
        stop_schedulers([process])
    early = early_runs(client, prefix)
    client.close()

    assert not early, f"runs started this many ms before their instant: {early}"
    offset_s = sample(text, "mega_scheduler_clock_offset_seconds", lock="main")
    assert 1.2 < offset_s < 1.8, text
    warnings = [line for line in log.read_text().splitlines() if "keep NTP on" in line]
    assert len(warnings) == 1, warnings  # once, though every claim measured it
    logged = re.search(r"clock is ([-+][\d.]+) s off the lock server's \(lock 'main'", warnings[0])
    assert logged and 1.2 < float(logged.group(1)) < 1.8, warnings[0]


def _epoch(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso).timestamp())
