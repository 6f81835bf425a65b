"""The noisy-neighbour demo on /demo/jobs, through its JSON with a real JobRunner: tenant big
floods the queue and tenant small adds five jobs after. In order, small's jobs wait behind the
flood; fair, they start at the next turns; rate-limited, starts stay under the cap. Bad input
and unknown runs are plain errors. Each test has its own NATS and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.jobs.tenant import LIMIT_PER_S
from mega.config import Config
from tests.factories import authed, job_worker, web_client


async def run_to_the_end(client: httpx.AsyncClient, headers: dict[str, str], **body: Any) -> Any:
    """Start a noisy run; its figures once every job of it has started."""
    answer = await client.post("/api/demo/jobs/noisy", json=body, headers=headers)
    assert answer.status_code == 201, answer.text
    run = answer.json()["data"]["run"]
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        figures = (await client.get(f"/api/demo/jobs/noisy/{run}")).json()["data"]
        tenants = figures["tenants"].values()
        if all(t["done"] == t["enqueued"] for t in tenants):
            return figures
        assert asyncio.get_running_loop().time() < deadline, figures
        await asyncio.sleep(0.1)


async def test_in_order_the_small_tenant_waits_behind_the_flood_and_fair_it_does_not(
    config: Config,
) -> None:
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        in_order = await run_to_the_end(client, headers, fair=False)
        fair = await run_to_the_end(client, headers, fair=True)
    assert in_order["mode"] == "in_order" and fair["mode"] == "fair"
    for figures in (in_order, fair):
        big, small = figures["tenants"]["big"], figures["tenants"]["small"]
        assert (big["enqueued"], big["done"], small["enqueued"], small["done"]) == (500, 500, 5, 5)
        assert sum(figures["starts_per_s"]) == 505
    # In order, small's five start after big's 500 (500 x 20 ms at 4 at once: over 2 s).
    assert in_order["tenants"]["small"]["wait_p50_ms"] >= 2000
    # Fair, at the next turns: far sooner than big's own median wait, and than in order.
    assert fair["tenants"]["small"]["wait_p99_ms"] < fair["tenants"]["big"]["wait_p50_ms"]
    assert fair["tenants"]["small"]["wait_p99_ms"] * 4 < in_order["tenants"]["small"]["wait_p50_ms"]


async def test_a_rate_limited_run_starts_no_more_than_its_cap_a_second(config: Config) -> None:
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        figures = await run_to_the_end(client, headers, fair=True, rate_limited=True)
    assert figures["mode"] == "limited"
    assert sum(figures["starts_per_s"]) == 65
    assert max(figures["starts_per_s"]) <= LIMIT_PER_S
    assert len(figures["starts_per_s"]) >= 65 // LIMIT_PER_S  # it took at least 3 seconds


async def test_bad_input_and_unknown_runs_are_plain_errors(config: Config) -> None:
    async with web_client(config) as client:
        assert (await client.post("/api/demo/jobs/noisy", json={"fair": True})).status_code == 401
        headers = await authed(client, "/demo/jobs")
        answer = await client.post("/api/demo/jobs/noisy", json={"fair": "maybe"}, headers=headers)
        assert answer.status_code == 422
        assert answer.json()["error"]["fields"]["fair"] == "must be true or false"
        answer = await client.post("/api/demo/jobs/noisy", json={}, headers=headers)
        assert answer.status_code == 422 and "fair" in answer.json()["error"]["fields"]
        answer = await client.get("/api/demo/jobs/noisy/0123456789ab")
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == (
            "no noisy-neighbour run '0123456789ab' (kept an hour)"
        )
        assert (await client.get("/api/demo/jobs/noisy/NOT-A-RUN")).status_code == 422
