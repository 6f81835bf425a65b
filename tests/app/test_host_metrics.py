"""Prometheus counters of the real hosts, read over HTTP after real jobs and ticks."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mega.config import load_config
from mega.drivers.embedded import free_port
from tests.app.test_web_metrics import sample
from tests.factories import SAMPLE_REGISTRATIONS, csrf_from, login, sample_config, web_client

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@dataclass
class Host:
    """A `mega` host process and the log its output goes to."""

    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def host(command: str, config: Path, env: dict[str, str]) -> Iterator[Host]:
    """`mega <command>` running, its output in a log beside the config; stopped by SIGTERM, after
    which it must exit 0 (the log is quoted when it does not)."""
    log = config.with_name(f"{command}.log")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mega", command, "--config", str(config)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Host(process, log)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        assert code == 0, f"{command} exited {code}:\n{log.read_text()}"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        return str(response.read().decode())


async def scrape(port: int, running: Host, timeout_s: float = 60) -> str:
    """The host's /metrics text, once its metrics server answers; its log if it exits first."""
    deadline = time.monotonic() + timeout_s
    while running.process.poll() is None and time.monotonic() < deadline:
        try:
            return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        except OSError:
            await asyncio.sleep(0.1)
    code, log = running.process.poll(), running.log.read_text()
    raise AssertionError(f"no metrics on port {port} (exit code {code}):\n{log}")


async def test_worker_host_counts_jobs_and_web_counts_enqueues(
    tmp_path: Path, nats_factory: Callable[[], Any], redis_factory: Callable[[], Any]
) -> None:
    port = free_port()
    metrics = f'\nmetrics = {{"enabled": True, "worker_port": {port}}}\n'
    path = sample_config(
        tmp_path,
        nats_url=nats_factory().url,
        redis_url=redis_factory().url,
        body=SAMPLE_REGISTRATIONS + metrics,
    )
    async with web_client(load_config(path)) as client:
        await login(client)
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/jobs")).text)}
        with host("worker", path, {}) as worker:
            await scrape(port, worker)  # the host is up and consuming
            for mode in ("ok", "ok", "flaky", "fail"):
                await client.post(
                    "/api/demo/jobs", json={"to": "a@b.c", "mode": mode}, headers=headers
                )
            for _ in range(200):
                text = await scrape(port, worker)
                if sample(text, "mega_job_events_total", job="EmailJob", event="dlq") == 1:
                    break
                await asyncio.sleep(0.1)
        web_text = (await client.get("/metrics")).text

    def count(event: str) -> float:
        return sample(text, "mega_job_events_total", job="EmailJob", event=event)

    assert (count("done"), count("retry"), count("dlq")) == (3, 3, 1)  # flaky 1 + fail 2 retries
    assert count("fail") == 1  # the fail job's last attempt
    assert sample(text, "mega_job_duration_seconds_count", job="EmailJob") == 3 + 3 + 1
    assert sample(text, "mega_job_start_latency_seconds_count", job="EmailJob") == 4
    assert sample(web_text, "mega_job_events_total", job="EmailJob", event="dispatch") >= 4


async def test_scheduler_host_counts_ticks(
    tmp_path: Path, nats_url: str, redis_url: str, prefix: str
) -> None:
    port = free_port()
    body = (
        "from tests.app.cluster_schedules import EverySecond\nschedules = [EverySecond]\n"
        f'metrics = {{"enabled": True, "scheduler_port": {port}}}\n'
    )
    path = sample_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body)
    with host("scheduler", path, {"CLUSTER_PREFIX": prefix}) as scheduler:
        deadline = time.monotonic() + 30
        while True:  # scraped until two ticks have run
            text = await scrape(port, scheduler)
            runs = sample(text, "mega_schedule_events_total", schedule="EverySecond", event="run")
            if runs >= 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    done = sample(text, "mega_schedule_events_total", schedule="EverySecond", event="done")
    assert (runs >= 2 and done == runs) or done == runs - 1  # a tick may be mid-run at the scrape
    assert sample(text, "mega_schedule_lateness_seconds_count", schedule="EverySecond") == runs
