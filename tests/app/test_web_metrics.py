"""/metrics of the sample's web app after real work: pool tasks and manual ticks are counted."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from mega.config import load_config
from tests.factories import SAMPLE_REGISTRATIONS, csrf_from, login, sample_config, web_client

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
