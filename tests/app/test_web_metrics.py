"""/metrics of the sample's web app after real work: pool tasks and manual ticks are counted."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from mega import JobQueue
from mega.config import load_config
from mega.testing import fake_clock
from tests.factories import (
    SAMPLE_REGISTRATIONS,
    csrf_from,
    login,
    sample_config,
    web_client,
    write_config,
)
from tests.mega.jobs.test_contract import DRIVERS, MEMORY_BUS, POSTGRES_BUS, REDIS_BUS

METRICS_ON = SAMPLE_REGISTRATIONS + '\nmetrics = {"enabled": True}\n'


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample in the text exposition (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


async def test_pool_tasks_and_manual_ticks_are_counted(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = load_config(
        sample_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=METRICS_ON)
    )
    async with web_client(config, pools=True) as client:
        await login(client)
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo")).text)}
        before = await scrape(client)
        for n in range(3):
            response = await client.post(
                "/api/demo/worker/hash", json={"input": str(n), "rounds": 10}, headers=headers
            )
            assert response.status_code == 200
        await client.post("/api/demo/cron/run", json={}, headers=headers)
        after = await scrape(client)

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("mega_pool_tasks_total", worker="hash", outcome="done") == 3
    assert delta("mega_pool_task_duration_seconds_count", worker="hash") == 3
    assert delta("mega_schedule_events_total", schedule="CronCounterSchedule", event="run") == 1
    assert delta("mega_schedule_events_total", schedule="CronCounterSchedule", event="done") == 1
    assert sample(after, "mega_pool_queue_depth", worker="hash") == 0


DEPTH_JOB = """
from mega import Job


class DepthJob(Job):
    bus = "jobs"
    subject = "{prefix}.depth"

    async def run(self, payload, ctx):
        return None


jobs = [DepthJob]
metrics = {{"enabled": True}}
"""


@pytest.mark.parametrize("driver", DRIVERS)
async def test_the_depth_and_the_oldest_age_of_each_configured_queue(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    prefix: str,
    driver: str,
) -> None:
    """Read from the bus when scraped: 5 jobs enqueued and no worker, 5 waiting."""
    buses = (
        POSTGRES_BUS % request.getfixturevalue("postgres_url")
        if driver == "postgres"
        else {"nats": "", "redis": REDIS_BUS, "memory": MEMORY_BUS}[driver]
    )
    body = buses + DEPTH_JOB.format(prefix=prefix)
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    async with web_client(config) as client:
        queue = JobQueue(client.app.state.ctx, "jobs")
        [job] = config.jobs
        assert queue.bus.driver == driver
        empty = await scrape(client)
        await queue.enqueue_many(job, [{"n": n} for n in range(5)])
        with fake_clock() as clock:
            await clock.advance(1.1)  # past the last read's reuse, and the oldest a second old
            text = await scrape(client)
    assert sample(empty, "mega_queue_depth", job="DepthJob") == 0
    assert "mega_queue_depth{" in empty  # a sample, 0, not a missing one
    assert sample(text, "mega_queue_depth", job="DepthJob") == 5
    assert sample(text, "mega_queue_oldest_seconds", job="DepthJob") >= 1.0


@pytest.mark.parametrize(
    ("env", "served"),
    [
        ({}, False),  # compose, systemd: the web port is public and no token was set
        ({"MEGA_METRICS_TOKEN": "t" * 32}, True),  # behind the token
        ({"MEGA_ENV": "dev"}, True),  # mega dev: this machine alone
    ],
)
def test_the_samples_web_metrics_are_never_open_on_a_public_port(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], served: bool
) -> None:
    for name in ("MEGA_METRICS_TOKEN", "MEGA_ENV"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load_config(Path(__file__).resolve().parents[2] / "mega_config.py", signs=False)
    assert config.metrics.web is served
    assert config.metrics.token == env.get("MEGA_METRICS_TOKEN")
