"""/demo/jobs and its JSON with a real JobRunner: ok, flaky and fail modes end to end, the DLQ,
requeue, and bad input that enqueues nothing. Each test has its own NATS and Redis."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.jobs.email import SLOW_ACK_WAITS, SLOW_STEPS, EmailJob
from app.routes.api_jobs import RequeueRequest, requeue, requeued_text
from app.services.instances import short_instance
from app.services.job_card import clock
from mega import JobQueue
from mega.config import Config
from mega.drivers.memory import MemoryBus
from mega.drivers.nats.names import stream_name
from mega.jobs.spec import job_lane
from mega.lanes.dlq import make_record
from mega.testing import memory_context
from tests.factories import (
    WebClient,
    authed,
    csrf_from,
    job_worker,
    login,
    sample_config_for,
    web_client,
)

ROOT = Path(__file__).resolve().parents[2]
DELAY = "must be a whole number of milliseconds from 0 to 60000"
COUNT = "must be a whole number from 1 to 50"
EMAIL = "is not a valid e-mail address (one like name@example.com, at most 254 characters)"


async def until_logged(path: Path, text: str, *, times: int, timeout_s: float = 60) -> None:
    """Until `text` is in the log at `path` `times` times (a start-up line of each host)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (path.exists() and path.read_text(errors="replace").count(text) >= times):
        assert asyncio.get_running_loop().time() < deadline, f"{text!r} not logged {times} times"
        await asyncio.sleep(0.1)


async def wait_for_job(
    client: httpx.AsyncClient, job_id: str, state: str, timeout_s: float = 20
) -> dict[str, Any]:
    """The page's jobs (GET /api/demo/jobs) once job `job_id`'s card says `state`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        data: dict[str, Any] = (await client.get("/api/demo/jobs")).json()["data"]
        job = next((j for j in data["jobs"] if j["id"] == job_id), None)
        if job is not None and job["state"] == state:
            return data
        assert asyncio.get_running_loop().time() < deadline, (
            f"job {job_id} never reached {state}: {job}"
        )
        await asyncio.sleep(0.1)


async def wait_for_state(
    client: httpx.AsyncClient, job_id: str, state: str, timeout_s: float = 20
) -> dict[str, Any]:
    """The job's status (GET /api/demo/jobs/{id}) once its record says `state`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        answer = await client.get(f"/api/demo/jobs/{job_id}")
        job: dict[str, Any] | None = (
            answer.json().get("data") if answer.status_code == 200 else None
        )
        if job is not None and job["state"] == state:
            return job
        assert asyncio.get_running_loop().time() < deadline, f"{job_id} never {state}: {job}"
        await asyncio.sleep(0.05)


async def stream_messages(client: WebClient) -> int:
    js = client.app.state.ctx.bus("jobs").js
    return int((await js.stream_info(stream_name(EmailJob.subject))).state.messages)


async def enqueue(client: httpx.AsyncClient, headers: dict[str, str], mode: str) -> str:
    response = await client.post(
        "/api/demo/jobs", json={"to": "ada@example.com", "mode": mode}, headers=headers
    )
    assert response.status_code == 201, response.text
    return str(response.json()["data"]["id"])


async def test_anonymous_is_refused(config: Config) -> None:
    async with web_client(config) as client:
        assert (await client.get("/api/demo/jobs")).status_code == 401
        assert (
            await client.post("/api/demo/jobs", json={"to": "a", "mode": "ok"})
        ).status_code == 401
        assert (await client.get("/demo/jobs")).status_code == 303


async def test_ok_flaky_and_fail_end_to_end(config: Config) -> None:
    async with web_client(config) as client, job_worker(config) as worker:
        headers = await authed(client, "/demo/jobs")
        ok_id = await enqueue(client, headers, "ok")
        flaky_id = await enqueue(client, headers, "flaky")
        fail_id = await enqueue(client, headers, "fail")

        data = await wait_for_job(client, ok_id, "done")
        ok_job = next(j for j in data["jobs"] if j["id"] == ok_id)
        assert ok_job["attempts"] == 1 and ok_job["progress"] is None  # ok reports none
        assert [line["kind"] for line in ok_job["lines"]] == ["enqueued", "done"]
        assert all(set(line) == {"kind", "at", "time", "detail"} for line in ok_job["lines"])
        assert ok_job["result"] == {"sent_to": "ada@example.com", "attempt": 1}
        # Every attempt names the worker process that ran it, by its short id.
        here = short_instance(worker.instance_id)
        assert re.fullmatch(
            rf"attempt 1 on worker {re.escape(here)} succeeded in \d+ ms",
            ok_job["lines"][1]["detail"],
        )

        data = await wait_for_job(client, flaky_id, "done")
        flaky = next(j for j in data["jobs"] if j["id"] == flaky_id)
        assert flaky["attempts"] == 2
        assert [line["kind"] for line in flaky["lines"]] == ["enqueued", "retry", "done"]
        # The failed attempt stays on the card: the record's history keeps it.
        assert flaky["lines"][1]["detail"] == (
            f"attempt 1 on worker {here} failed: SimulatedSendError: SMTP server timed out "
            "(first attempt only)"
        )
        assert flaky["lines"][2]["detail"].startswith(f"attempt 2 on worker {here} succeeded in ")
        assert flaky["result"] == {"sent_to": "ada@example.com", "attempt": 2}

        data = await wait_for_job(client, fail_id, "dlq")
        failed = next(j for j in data["jobs"] if j["id"] == fail_id)
        assert failed["attempts"] == 3
        assert [line["kind"] for line in failed["lines"]] == [
            "enqueued",
            "retry",
            "retry",
            "fail",
            "dlq",
        ]
        assert failed["lines"][-1]["detail"] == "moved to the dead-letter queue after 3 attempts"
        assert failed["lines"][3]["detail"].endswith("rejected the message; no tries left")
        assert (failed["result"], failed["cancellable"]) == (None, False)
        assert data["dlq"]["count"] == 1
        (item,) = data["dlq"]["items"]
        assert item["id"] == fail_id and item["attempts"] == 3
        assert item["error"] == "SimulatedSendError: mailbox ada@example.com rejected the message"
        assert item["failed_at"] > 0
        assert await stream_messages(client) == 0  # the work stream holds nothing any more

        console = (await client.get("/api/demo/console")).json()["data"]["jobs"]
        assert console["ok"] and console["dlq"] == 1 and console["pending"] == 0
        assert console["start_latency_p50_ms"] is not None


async def test_a_job_answers_its_status_and_result_and_a_slow_one_is_cancelled_mid_run(
    config: Config,
) -> None:
    async with web_client(config) as client, job_worker(config):
        assert (await client.get("/api/demo/jobs/nope")).status_code == 401
        headers = await authed(client, "/demo/jobs")
        ok_id = await enqueue(client, headers, "ok")
        slow_id = await enqueue(client, headers, "slow")
        job = await wait_for_state(client, ok_id, "done")
        assert (job["state"], job["attempts"], job["job"]) == ("done", 1, "EmailJob")
        assert job["result"] == {"sent_to": "ada@example.com", "attempt": 1}

        await wait_for_state(client, slow_id, "running")
        answer = await client.post(f"/api/demo/jobs/{slow_id}/cancel", headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["data"] == {"cancelled": True, "state": "cancelled"}
        deadline = asyncio.get_running_loop().time() + 10
        while (await stream_messages(client)) != 0:  # its worker lets it go, acked
            assert asyncio.get_running_loop().time() < deadline, "the slow job still held"
            await asyncio.sleep(0.1)
        job = (await client.get(f"/api/demo/jobs/{slow_id}")).json()["data"]
        assert (job["state"], job["attempts"], job["result"]) == ("cancelled", 1, None)
        again = await client.post(f"/api/demo/jobs/{ok_id}/cancel", headers=headers)
        assert again.json()["data"] == {"cancelled": False, "state": "done"}
        missing = await client.get("/api/demo/jobs/no-such-job")
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == "no job with id 'no-such-job' (kept a day)"


async def test_a_delayed_job_says_when_it_is_due_and_starts_no_earlier(config: Config) -> None:
    """A delayed job's card says it is held and until when (its record's due time), it can be
    cancelled meanwhile, and its first attempt starts no earlier than that time."""
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        sent = await client.post(
            "/api/demo/jobs",
            json={"to": "ada@example.com", "mode": "flaky", "delay_ms": 1500},
            headers=headers,
        )
        job_id = sent.json()["data"]["id"]
        jobs = (await client.get("/api/demo/jobs")).json()["data"]["jobs"]
        [held] = [j for j in jobs if j["id"] == job_id]
        record = (await client.get(f"/api/demo/jobs/{job_id}")).json()["data"]
        assert (held["state"], held["cancellable"], record["state"]) == ("delayed", True, "delayed")
        due_at = record["due_at"]
        assert due_at == record["enqueued_at"] + 1500
        [line] = held["lines"]
        assert line["detail"] == (
            f"enqueued, held 1500 ms: due at {clock(due_at)} (no slot taken meanwhile)"
        )

        await wait_for_job(client, job_id, "done")
        record = (await client.get(f"/api/demo/jobs/{job_id}")).json()["data"]
        [first] = record["history"]
        assert (first["attempt"], first["state"]) == (1, "retrying")
        assert first["started_at"] >= due_at  # it waited on the broker, not in a slot
        assert record["started_at"] > first["started_at"] and record["attempts"] == 2


async def test_the_jobs_page_by_ten_with_a_link_to_older_jobs(config: Config) -> None:
    """/demo/jobs shows the newest 10 jobs and links to the older ones (no JavaScript needed);
    the JSON route still lists every kept job unless asked for a page."""
    async with web_client(config) as client:
        headers = await authed(client, "/demo/jobs")
        ids = [await enqueue(client, headers, "ok") for _ in range(12)][::-1]  # newest first

        everything = (await client.get("/api/demo/jobs")).json()["data"]
        assert [j["id"] for j in everything["jobs"]] == ids and everything["older"] is None
        first = (await client.get("/api/demo/jobs", params={"limit": 10})).json()["data"]
        assert [j["id"] for j in first["jobs"]] == ids[:10] and first["older"] == ids[9]
        rest = (await client.get(f"/api/demo/jobs?limit=10&before={ids[9]}")).json()["data"]
        assert [j["id"] for j in rest["jobs"]] == ids[10:] and rest["older"] is None
        gone = (await client.get("/api/demo/jobs?before=0123456789ab")).json()["data"]
        assert gone["jobs"] == [] and gone["older"] is None  # no longer kept: an empty page
        for query, field, sentence in [
            ("limit=0", "limit", "must be at least 1"),
            ("limit=31", "limit", "must be at most 30"),
            ("limit=ten", "limit", "must be a whole number"),
            ("before=a%20b", "before", "has characters that are not allowed here"),
        ]:
            refused = await client.get(f"/api/demo/jobs?{query}")
            assert refused.status_code == 422, query
            assert refused.json()["error"]["fields"] == {field: sentence}

        page = (await client.get("/demo/jobs")).text
        assert re.findall(r'<article class="job" data-key="(\w+)"', page) == ids[:10]
        older = re.search(r'<a href="(/demo/jobs\?before=\w+)#timeline" id="jobs-older"\s*>', page)
        assert older, "no link to the older jobs"
        page = (await client.get(older[1])).text
        assert re.findall(r'<article class="job" data-key="(\w+)"', page) == ids[10:]
        assert 'id="jobs-older" hidden' in page  # nothing older than those
        assert re.search(r'<a href="/demo/jobs#timeline" id="jobs-newest"\s*>', page)


@pytest.mark.parametrize(
    "instance,short",
    [
        ("worker@box:4121:a1b2c3", "a1b2c3 (pid 4121)"),
        ("worker@my:host:77:ffffff", "ffffff (pid 77)"),
        ("a-name-of-its-own-choosing", "own-choosing"),
    ],
)
def test_a_worker_is_named_by_its_short_id_and_pid(instance: str, short: str) -> None:
    assert short_instance(instance) == short


@pytest.mark.slow
async def test_slow_outlives_its_ack_wait_on_one_attempt_and_reports_each_step(
    config: Config,
) -> None:
    """The `slow` mode runs 3x EmailJob's ack wait: its lease is renewed, so it is never
    redelivered, and its progress reaches the page step by step. A delayed job meanwhile
    waits on the broker without a slot and runs in the other one."""
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        started = asyncio.get_running_loop().time()
        slow = await enqueue(client, headers, "slow")
        await wait_for_job(client, slow, "running")
        sent = await client.post(
            "/api/demo/jobs",
            json={"to": "ada@example.com", "mode": "ok", "delay_ms": 1000},
            headers=headers,
        )
        later = sent.json()["data"]["id"]
        await wait_for_job(client, later, "done")
        record = (await client.get(f"/api/demo/jobs/{later}")).json()["data"]
        assert record["started_at"] >= record["enqueued_at"] + 1000  # it waited on the broker

        seen: list[tuple[float, str]] = []  # the slow job's progress as the page polls it
        total_s = SLOW_ACK_WAITS * EmailJob.ack_wait_s
        deadline = started + total_s + 15
        while True:
            data = (await client.get("/api/demo/jobs")).json()["data"]
            job = next(j for j in data["jobs"] if j["id"] == slow)
            if job["progress"] and (not seen or seen[-1] != tuple(job["progress"].values())):
                seen.append((job["progress"]["fraction"], job["progress"]["note"]))
            if job["state"] == "done":
                break
            assert job["state"] == "running" and job["attempts"] == 1, job
            assert asyncio.get_running_loop().time() < deadline, f"slow never finished: {job}"
            await asyncio.sleep(0.2)
        assert asyncio.get_running_loop().time() - started >= total_s
        assert job["attempts"] == 1  # never redelivered, though it outlived its ack wait
        assert [line["kind"] for line in job["lines"]] == ["enqueued", "done"]
        assert job["progress"] is None  # a bar only while the attempt runs
        fractions = [fraction for fraction, _ in seen]
        assert fractions == sorted(fractions) and len(fractions) >= SLOW_STEPS - 1, seen
        assert seen[0][1].endswith(f"of {SLOW_STEPS} steps done")


async def test_requeue_from_the_dlq_resets_attempts(config: Config) -> None:
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        fail_id = await enqueue(client, headers, "fail")
        await wait_for_job(client, fail_id, "dlq")
        missing = await client.post(
            "/api/demo/jobs/dlq/requeue", json={"id": "nope"}, headers=headers
        )
        assert missing.status_code == 404
        before_ms = int(datetime.now(UTC).timestamp() * 1000)
        requeued = await client.post(
            "/api/demo/jobs/dlq/requeue", json={"id": fail_id}, headers=headers
        )
        assert requeued.json()["data"] == {"requeued": 1, "left_crashed": 0}
        deadline = asyncio.get_running_loop().time() + 20
        while True:  # its second run, back in the DLQ (the first run's record said dlq too)
            record = (await client.get(f"/api/demo/jobs/{fail_id}")).json()["data"]
            if record["state"] == "dlq" and record["finished_at"] > before_ms:
                break
            assert asyncio.get_running_loop().time() < deadline, record
            await asyncio.sleep(0.1)
        assert record["attempts"] == 3  # counted again from 1
        assert [a["attempt"] for a in record["history"]] == [1, 2]
        assert all(a["started_at"] > before_ms for a in record["history"])  # this run's
        data = (await client.get("/api/demo/jobs")).json()["data"]
        job = next(j for j in data["jobs"] if j["id"] == fail_id)
        # Its first three runs are kept above the requeue (a Retry from the console or `mega dlq
        # requeue` keeps them alike: the record does), then its three runs since.
        assert [line["kind"] for line in job["lines"]] == [
            "retry",
            "retry",
            "dlq",
            "enqueued",
            "retry",
            "retry",
            "fail",
            "dlq",
        ]
        assert job["lines"][2]["detail"].endswith("; to the DLQ")
        assert job["lines"][3]["detail"] == "requeued from the DLQ: attempts count from 1 again"
        assert record["requeues"] == 1
        assert [(a["attempt"], a["state"]) for a in record["before_requeue"]] == [
            (1, "retrying"),
            (2, "retrying"),
            (3, "dlq"),
        ]
        assert data["dlq"]["count"] == 1


@pytest.mark.parametrize(
    "body,field,message",
    [
        ({"to": "a@b.c", "mode": "sometimes"}, "mode", None),
        ({"to": "", "mode": "ok"}, "to", EMAIL),
        ({"to": "   ", "mode": "ok"}, "to", EMAIL),
        ({"to": "x" * 255, "mode": "ok"}, "to", EMAIL),
        ({"mode": "ok"}, "to", "is required"),
        ({"to": ["a"], "mode": "ok"}, "to", EMAIL),
        ({"to": "a@b.co\n23:59:59 INFO forged", "mode": "ok"}, "to", EMAIL),  # no forged log line
        ({"to": "a\u202eb@example.com", "mode": "ok"}, "to", EMAIL),
        ({"to": "not-an-address", "mode": "ok"}, "to", EMAIL),
        ({"to": "Ada, L <ada@example.com>", "mode": "ok"}, "to", EMAIL),
        ({"to": "a@example.com", "delay_ms": -1}, "delay_ms", DELAY),
        ({"to": "a@example.com", "delay_ms": 60001}, "delay_ms", DELAY),
        ({"to": "a@example.com", "delay_ms": "5"}, "delay_ms", DELAY),
        ({"to": "a@example.com", "delay_ms": "abc"}, "delay_ms", DELAY),  # as the page sends it
        ({"to": "a@example.com", "delay_ms": 1.5}, "delay_ms", DELAY),
        ({"to": "a@example.com", "delay_ms": True}, "delay_ms", DELAY),
        ({"to": "a@example.com", "delay_ms": None}, "delay_ms", DELAY),
        ({"to": "a@example.com", "count": 0}, "count", COUNT),
        ({"to": "a@example.com", "count": 51}, "count", COUNT),
        ({"to": "a@example.com", "count": "20"}, "count", COUNT),
    ],
)
async def test_bad_input_is_422_and_enqueues_nothing(
    config: Config, body: dict[str, Any], field: str, message: str | None
) -> None:
    async with web_client(config) as client:
        headers = await authed(client, "/demo/jobs")
        before = (await client.get("/api/demo/jobs")).json()["data"]
        response = await client.post("/api/demo/jobs", json=body, headers=headers)
        assert response.status_code == 422
        got = response.json()["error"]["fields"][field]
        assert "Input should be" not in got  # a plain sentence, not pydantic's wording
        assert message is None or got == message
        assert (await client.get("/api/demo/jobs")).json()["data"] == before
        assert await stream_messages(client) == 0


async def test_count_enqueues_that_many_jobs_and_answers_their_ids(config: Config) -> None:
    async with web_client(config) as client:
        headers = await authed(client, "/demo/jobs")
        one = await client.post("/api/demo/jobs", json={"to": "a@example.com"}, headers=headers)
        assert one.status_code == 201 and list(one.json()["data"]) == ["id"]
        many = await client.post(
            "/api/demo/jobs", json={"to": "b@example.com", "count": 20}, headers=headers
        )
        assert many.status_code == 201, many.text
        data = many.json()["data"]
        assert len(data["ids"]) == len(set(data["ids"])) == 20 and data["id"] == data["ids"][0]
        jobs = (await client.get("/api/demo/jobs")).json()["data"]["jobs"]
        listed = [job["id"] for job in jobs if job["to"] == "b@example.com"]
        assert sorted(listed) == sorted(data["ids"])
        assert await stream_messages(client) == 21


async def test_no_js_form_enqueues_and_shows_field_errors(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        token = csrf_from((await client.get("/demo/jobs")).text)
        bad = await client.post("/demo/jobs", data={"csrf_token": token, "to": "", "mode": "ok"})
        assert bad.status_code == 422 and "field-error" in bad.text
        assert '<span class="field-error" id="error-to">is required</span>' in bad.text
        late = await client.post(
            "/demo/jobs",
            data={"csrf_token": token, "to": "a@example.com", "mode": "ok", "delay_ms": "soon"},
        )
        assert late.status_code == 422 and "Input should be" not in late.text
        assert f'<span class="field-error" id="error-delay_ms">{DELAY}</span>' in late.text
        assert 'value="soon"' in late.text  # the form keeps what was typed
        many = await client.post(
            "/demo/jobs",
            data={"csrf_token": token, "to": "a@example.com", "mode": "ok", "count": "51"},
        )
        assert f'<span class="field-error" id="error-count">{COUNT}</span>' in many.text
        assert await stream_messages(client) == 0
        good = await client.post(
            "/demo/jobs", data={"csrf_token": token, "to": "o'neil&co@example.com", "mode": "ok"}
        )
        assert good.status_code == 303
        page = await client.get(good.headers["location"])
        assert "enqueued" in page.text and "o&#39;neil&amp;co@example.com" in page.text
        assert await stream_messages(client) == 1
        three = await client.post(
            "/demo/jobs",
            data={"csrf_token": token, "to": "c@example.com", "mode": "ok", "count": "3"},
        )
        assert three.status_code == 303
        assert "3 jobs enqueued." in (await client.get("/demo/jobs")).text
        assert await stream_messages(client) == 4


async def test_nats_down_is_503_naming_it_and_other_pages_work(
    tmp_path: Path, nats_factory: Callable[[], Any], redis_factory: Callable[[], Any]
) -> None:
    nats = nats_factory()
    config = sample_config_for(tmp_path, nats.url, redis_factory().url)
    async with web_client(config) as client:
        headers = await authed(client, "/demo/jobs")
        nats.stop()
        await asyncio.sleep(0.3)
        response = await client.post(
            "/api/demo/jobs", json={"to": "a@b.c", "mode": "ok"}, headers=headers
        )
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "dependency.unavailable"
        assert "NATS" in response.json()["error"]["message"]
        assert response.json()["meta"]["dependency"] == "nats"
        state = await client.get("/api/demo/jobs")  # it reads the DLQ from NATS: 503 too
        assert state.status_code == 503 and state.json()["meta"]["dependency"] == "nats"
        assert (await client.get("/api/demo/cron")).status_code == 200
        nats.start()
        for _ in range(50):
            response = await client.post(
                "/api/demo/jobs", json={"to": "a@b.c", "mode": "ok"}, headers=headers
            )
            if response.status_code == 201:
                break
            await asyncio.sleep(0.2)
        assert response.status_code == 201
        data = (await client.get("/api/demo/jobs")).json()["data"]
        assert len(data["jobs"]) == 1  # the refused enqueue left no phantom job behind


async def test_dlq_cli_lists_requeues_and_purges(config: Config) -> None:
    """`mega dlq` as a user runs it, against the DLQ a failing job filled."""
    import subprocess
    import sys

    def mega_dlq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mega", "dlq", *args, "--config", str(config.path)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    async with web_client(config) as client:
        headers = await authed(client, "/demo/jobs")
        async with job_worker(config):
            fail_id = await enqueue(client, headers, "fail")
            await wait_for_job(client, fail_id, "dlq")
        listed = await asyncio.to_thread(mega_dlq, "list")
        assert listed.returncode == 0, listed.stderr
        assert "EmailJob: 1 dead letter(s)" in listed.stdout and fail_id in listed.stdout
        assert "SimulatedSendError" in listed.stdout

        refused = await asyncio.to_thread(mega_dlq, "purge")
        assert refused.returncode == 2 and "--job" in refused.stderr
        unknown = await asyncio.to_thread(mega_dlq, "list", "--job", "Nope")
        assert unknown.returncode == 2 and "no job named 'Nope'" in unknown.stderr

        requeued = await asyncio.to_thread(
            mega_dlq, "requeue", "--job", "EmailJob", "--id", fail_id
        )
        assert "requeued 1 job(s)" in requeued.stdout
        assert await stream_messages(client) == 1  # back on the work stream, nobody consuming
        async with job_worker(config):
            # Watch the DLQ itself refill (the CLI's requeue is no page's).
            for _ in range(200):
                if (await client.get("/api/demo/jobs")).json()["data"]["dlq"]["count"] == 1:
                    break
                await asyncio.sleep(0.1)
        assert await stream_messages(client) == 0
        purged = await asyncio.to_thread(mega_dlq, "purge", "--job", "EmailJob")
        assert "purged 1 record(s)" in purged.stdout
        assert (await client.get("/api/demo/jobs")).json()["data"]["dlq"]["count"] == 0


@pytest.mark.slow
async def test_a_crash_job_kills_a_worker_on_every_attempt_then_lands_in_the_dlq(
    config: Config, tmp_path: Path
) -> None:
    """The `crash` mode: each attempt kills the `mega worker` that runs it (os._exit), nothing
    acks it, and after EmailJob's ack wait another worker gets it. Two workers run, and a dead
    one is started again as `mega dev` does. The delivery after the last attempt is not run:
    the queue dead-letters it as WorkerCrashed."""
    command = [sys.executable, "-m", "mega", "worker", "--config", str(config.path)]
    logs = tmp_path / "workers.log"

    def spawn() -> subprocess.Popen[bytes]:
        with logs.open("ab") as log:
            return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    workers = [spawn() for _ in range(2)]
    deaths: list[int | None] = []
    attempts = EmailJob.retries + 1
    try:
        async with web_client(config) as client:
            headers = await authed(client, "/demo/jobs")
            await until_logged(logs, "consuming", times=2)  # both workers up and pulling
            job_id = await enqueue(client, headers, "crash")
            deadline = asyncio.get_running_loop().time() + attempts * EmailJob.ack_wait_s + 30
            while True:
                for index, worker in enumerate(workers):
                    if worker.poll() is not None:  # died: start another, as mega dev would
                        deaths.append(worker.returncode)
                        workers[index] = spawn()
                data = (await client.get("/api/demo/jobs")).json()["data"]
                job = next(j for j in data["jobs"] if j["id"] == job_id)
                if job["state"] == "dlq":
                    break
                assert asyncio.get_running_loop().time() < deadline, (
                    f"crash job never reached the DLQ: {job}; deaths {deaths}; "
                    f"{logs.read_text()[-3000:]}"
                )
                await asyncio.sleep(0.1)
            assert deaths == [1] * attempts, deaths  # one dead worker per attempt, no more
            assert job["attempts"] == attempts
            # Each attempt's worker died: the card says so of every one, the last included.
            kinds = [line["kind"] for line in job["lines"]]
            assert kinds == ["enqueued"] + ["lost"] * attempts + ["dlq"], job["lines"]
            record = (await client.get(f"/api/demo/jobs/{job_id}")).json()["data"]
            assert [(a["attempt"], a["state"]) for a in record["history"]] == [
                (n, "lost") for n in range(1, attempts)
            ]
            # Each attempt names the worker it killed: a crash job works a second before it
            # dies, and a run after the first stores its record before it starts.
            killed = [a["worker"] for a in record["history"]] + [record["worker"]]
            assert all(killed) and len(set(killed)) == attempts, killed
            assert [line["detail"] for line in job["lines"][1:-1]] == [
                f"attempt {n} on worker {short_instance(killed[n - 1])} never reported back: "
                "its worker died"
                for n in range(1, attempts + 1)
            ]
            assert record["error"]["type"] == "WorkerCrashed"
            [item] = [i for i in data["dlq"]["items"] if i["id"] == job_id]
            assert item["error"].startswith("WorkerCrashed: attempt 3 of 3 never reported back")
            assert item["attempts"] == attempts
            # The terminal counts as the page does: the delivery after attempt 3 is no attempt 4.
            logged = re.findall(
                rf"\b(\w+) job=EmailJob id={job_id} attempts?=(\d+)", logs.read_text()
            )
            assert ("fail", "3") in logged and ("dlq", "3") in logged, logged
            assert {count for _, count in logged} <= {"1", "2", "3"}, logged
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
                worker.wait(30)


async def test_the_list_shows_results_and_cancel_and_the_form_cancels_without_javascript(
    config: Config,
) -> None:
    """Each listed job carries its status record's state and result, and a Cancel form while it
    has not ended; the form cancels a delayed job with a flash notice (post, redirect, get)."""
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        ok_id = await enqueue(client, headers, "ok")
        sent = await client.post(
            "/api/demo/jobs",
            json={"to": "bob@example.com", "mode": "ok", "delay_ms": 60000},
            headers=headers,
        )
        held = sent.json()["data"]["id"]
        await wait_for_job(client, ok_id, "done")
        jobs = {j["id"]: j for j in (await client.get("/api/demo/jobs")).json()["data"]["jobs"]}
        assert (jobs[ok_id]["state"], jobs[ok_id]["cancellable"]) == ("done", False)
        assert jobs[ok_id]["result"] == {"sent_to": "ada@example.com", "attempt": 1}
        assert (jobs[held]["state"], jobs[held]["cancellable"], jobs[held]["result"]) == (
            "delayed",
            True,
            None,
        )

        page = (await client.get("/demo/jobs")).text
        forms = re.findall(r'<form method="post" action="/demo/jobs/(\w+)/cancel"', page)
        assert forms == [held]  # the ended job has none
        assert "Result <code>sent_to: ada@example.com, attempt: 1</code>" in page
        token = csrf_from(page)
        refused = await client.post(f"/demo/jobs/{held}/cancel")  # no CSRF token
        assert refused.status_code == 403
        done = await client.post(f"/demo/jobs/{held}/cancel", data={"csrf_token": token})
        assert done.status_code == 303 and done.headers["location"] == "/demo/jobs"
        page = (await client.get("/demo/jobs")).text
        assert f"Job {held} cancelled: it will not run again." in page
        assert re.search(rf'data-id="{held}" data-status="cancelled"', page)
        again = await client.post(f"/demo/jobs/{ok_id}/cancel", data={"csrf_token": token})
        assert again.status_code == 303
        page = (await client.get("/demo/jobs")).text
        assert f"Job {ok_id} was not cancelled: it had ended (done)." in page
        job = (await client.get(f"/api/demo/jobs/{held}")).json()["data"]
        assert (job["state"], job["attempts"]) == ("cancelled", 0)


async def test_a_permanent_job_goes_to_the_dlq_after_one_attempt(config: Config) -> None:
    async with web_client(config) as client, job_worker(config):
        headers = await authed(client, "/demo/jobs")
        job_id = await enqueue(client, headers, "permanent")
        data = await wait_for_job(client, job_id, "dlq")
        job = next(j for j in data["jobs"] if j["id"] == job_id)
        assert (job["state"], job["attempts"], job["cancellable"]) == ("dlq", 1, False)
        (item,) = data["dlq"]["items"]
        assert (item["id"], item["attempts"]) == (job_id, 1)
        message = "no mailbox ada@example.com: the domain says it does not exist"
        assert item["error"] == f"Permanent: {message}"
        status = (await client.get(f"/api/demo/jobs/{job_id}")).json()["data"]
        assert (status["state"], status["attempts"]) == ("dlq", 1)
        assert status["error"] == {"type": "Permanent", "message": message}
        page = (await client.get("/demo/jobs")).text
        assert "to ada@example.com, 1 attempt</span>" in page
        assert '<option value="permanent"' in page


async def test_requeue_all_leaves_the_jobs_that_killed_their_worker_unless_asked() -> None:
    """Each requeued crash job would kill a worker again, up to its attempts: "Requeue all"
    leaves them out and says so, unless its box (`crashed: true`) asks for them too, as
    `mega dlq requeue` asks for --all."""
    ctx = memory_context(caches=["main"])
    queue = JobQueue(ctx, "jobs")
    assert isinstance(queue.bus, MemoryBus)
    spec = await queue.ensure(EmailJob)
    for n, error in enumerate(["WorkerCrashed", "SimulatedSendError", "WorkerCrashed"]):
        payload = {"id": f"j{n}", "to": "a@b.co", "mode": "x"}
        record = make_record(
            spec.subject,
            f"j{n}",
            payload,
            error,
            "boom",
            attempts=3,
            first_enqueued_at=1,
            worker="w",
        )
        queue.bus.broker.lane(job_lane(spec)).dead_letter(record)
    redis = ctx.cache("main").native
    done = await requeue(queue, redis, RequeueRequest(all=True))
    assert (done.requeued, done.left_crashed) == (1, 2)
    assert requeued_text(done) == (
        "Requeued 1 job(s) from the DLQ. Left 2 that killed their worker (WorkerCrashed): each "
        "would kill one again; tick the box to requeue those too."
    )
    assert {r["id"] for r in await queue.dlq.list(EmailJob)} == {"j0", "j2"}
    done = await requeue(queue, redis, RequeueRequest(all=True, crashed=True))
    assert (done.requeued, done.left_crashed) == (2, 0) and await queue.dlq.count(EmailJob) == 0
