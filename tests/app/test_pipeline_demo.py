"""The pipeline demo on /demo/jobs, through its JSON with a real JobRunner: a photo resized to
a few sizes at once, then published once with every outcome. With a failing member the
publish job still runs once, and receives that member's error among the results. Bad input
and unknown runs are plain errors. Each test has its own NATS and Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.jobs.pipeline import SIZES, PublishJob
from mega.config import Config
from tests.factories import authed, job_worker, web_client
from tests.settled import settled


async def run_to_the_end(client: httpx.AsyncClient, headers: dict[str, str], **body: Any) -> Any:
    """Start a pipeline run; what GET says once it ended."""
    answer = await client.post("/api/demo/workflows", json=body, headers=headers)
    assert answer.status_code == 201, answer.text
    run = answer.json()["data"]["id"]
    deadline = asyncio.get_running_loop().time() + 30
    seen = set()
    while True:
        found = (await client.get(f"/api/demo/workflows/{run}")).json()["data"]
        seen.add(found["callback"]["state"])
        if found["state"] != "running" and found["callback_runs"]:
            found["callback_seen"] = seen
            return found
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.1)


async def test_the_publish_job_runs_once_with_every_rendition(config: Config) -> None:
    async with web_client(config) as client, job_worker(config) as worker:
        headers = await authed(client, "/demo/jobs")
        run = await run_to_the_end(client, headers, members=5)
        # A second callback would be a message of the publish job's lane: none is left.
        await settled(lambda: worker.queue(PublishJob.bus).stats(PublishJob), "the callback")
        again = (await client.get(f"/api/demo/workflows/{run['id']}")).json()["data"]
    assert run["state"] == "done" and again["callback_runs"] == 1
    assert "waiting" in run["callback_seen"]  # it waited for the members
    assert [(m["size"], m["state"], m["attempts"]) for m in run["members"]] == [
        (size, "done", 1) for size in SIZES[:5]
    ]
    assert run["members"][0]["result"] == {"size": 64, "url": f"/photos/{run['id']}/64.webp"}
    assert run["callback"] == {
        "state": "done",
        "result": {"published": list(SIZES[:5]), "missing": 0},
    }
    assert [r["id"] for r in run["results"]] == [f"wf~{run['id']}~{n}" for n in range(5)]
    assert all(r["state"] == "done" and r["job"] == "ResizeJob" for r in run["results"])


async def test_a_failing_member_reaches_the_publish_job_as_an_error(config: Config) -> None:
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        run = await run_to_the_end(client, headers, members=3, fail=True)
    assert [m["state"] for m in run["members"]] == ["done", "dlq", "done"]
    message = f"cannot resize {run['id']} to 128 px: the image is corrupt"
    assert run["members"][1]["error"] == message
    assert run["members"][1]["attempts"] == 1  # Permanent: no retry
    assert (run["state"], run["callback_runs"]) == ("done", 1)
    assert run["callback"]["result"] == {"published": [64, 256], "missing": 1}
    failed = run["results"][1]
    assert failed == {
        "id": f"wf~{run['id']}~1",
        "job": "ResizeJob",
        "state": "dlq",
        "error": {"type": "Permanent", "message": message},
    }


async def test_bad_input_and_unknown_runs_are_plain_errors(config: Config) -> None:
    async with web_client(config) as client:
        assert (await client.post("/api/demo/workflows", json={})).status_code == 401
        headers = await authed(client, "/demo/jobs")
        for members in (0, 9, "five"):
            answer = await client.post(
                "/api/demo/workflows", json={"members": members}, headers=headers
            )
            assert answer.status_code == 422, answer.text
            assert "members" in answer.json()["error"]["fields"]
        answer = await client.post("/api/demo/workflows", json={"fail": "x"}, headers=headers)
        assert answer.json()["error"]["fields"]["fail"] == "must be true or false"
        answer = await client.get("/api/demo/workflows/pl0123456789")
        assert answer.status_code == 404
        assert answer.json()["error"]["message"] == "no pipeline run 'pl0123456789' (kept a week)"
        assert (await client.get("/api/demo/workflows/NOT-A-RUN")).status_code == 422
