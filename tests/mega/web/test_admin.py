"""The admin pages (mega.web.admin) mounted by an app on the framework alone: the login, the
overview of a known state, one job's life, the search, the dead-letter browser's paging, retry
and purge, and the schedules' pause, resume and run now. Each test has its own NATS and Redis;
a JobWorker runs in the test's process."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from mega import group
from mega.config import Config, load_config
from mega.web import job_queue
from mega.web.tokens import create_token
from tests.factories import csrf_from, job_worker, login, web_client, write_config
from tests.mega.web.admin_site import ADMIN_DECLARATIONS, Boom

SITE = "tests.mega.web.admin_site:create_app"


@pytest.fixture
def config(
    tmp_path: Path, nats_factory: Callable[[], Any], redis_factory: Callable[[], Any]
) -> Config:
    path = write_config(
        tmp_path, nats_url=nats_factory().url, redis_url=redis_factory().url,
        body=ADMIN_DECLARATIONS, web_app=SITE,
    )  # fmt: skip
    return load_config(path)


@pytest.fixture
async def client(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    Boom.failing = True
    async with web_client(config) as client:
        yield client


async def enqueue(client: httpx.AsyncClient, payload: dict[str, Any]) -> str:
    return str(await job_queue(client.app, "jobs").enqueue(Boom, payload))  # type: ignore[attr-defined]


async def until(check: Callable[[], Any], timeout_s: float = 20) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)
    return value


async def dead_letters(client: httpx.AsyncClient, count: int) -> None:
    queue = job_queue(client.app, "jobs")  # type: ignore[attr-defined]

    async def stored() -> bool:
        return (await queue.stats(Boom)).dlq == count

    await until(stored)


async def form_post(client: httpx.AsyncClient, path: str, **fields: str) -> httpx.Response:
    token = csrf_from((await client.get("/admin/")).text)
    return await client.post(path, data={"csrf_token": token, **fields})


def text_of(html: str) -> str:
    """The page's words, tags and surplus spaces removed (for sentences across elements)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


async def test_the_pages_need_a_login_or_an_api_token(client: httpx.AsyncClient) -> None:
    for path in ("/admin/", "/admin/dlq/Boom", "/admin/jobs/x", "/admin/search?id=x"):
        page = await client.get(path)
        assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
        api = await client.get(path, headers={"Accept": "application/json"})
        assert api.status_code == 401
    refused = await client.post("/admin/schedules/Tidy/pause")
    assert refused.status_code == 403  # no session: no CSRF token either

    db = client.app.state.ctx.db  # type: ignore[attr-defined]
    token = await db.run(lambda session: create_token(session, "ops-bot"))
    bearer = {"Authorization": f"Bearer {token}"}
    overview = await client.get("/admin/", headers=bearer)
    assert overview.status_code == 200 and "Job queues" in overview.text
    assert "Log out" not in overview.text  # a token has no session to end
    paused = await client.post("/admin/schedules/Tidy/pause", headers=bearer)
    assert paused.status_code == 303  # a token needs no CSRF token
    wrong = await client.get("/admin/", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code in (303, 401)


async def test_the_overview_a_job_page_and_the_search(
    client: httpx.AsyncClient, config: Config
) -> None:
    await login(client)
    empty = await client.get("/admin/")
    assert empty.status_code == 200
    words = text_of(empty.text)
    assert "Boom bus jobs 0 0 0 — — 0" in words  # no consume loop seen yet: 0 workers
    assert "Welcome bus jobs 0 0 0" in words
    assert "No scheduler has recorded a tick lately" in words
    assert 'data-schedule="Tidy"' in empty.text and "0 0 1 1 *" in empty.text
    assert empty.headers["content-security-policy"].startswith("default-src 'self'")
    css = await client.get("/admin/admin.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")

    ok_id = await enqueue(client, {"to": "ada@example.com"})
    bad_id = await enqueue(client, {"fail": True, "n": 7})
    async with job_worker(config):
        await dead_letters(client, 1)
    queue = job_queue(client.app, "jobs")  # type: ignore[attr-defined]
    await until(lambda: _state_is(queue, ok_id, "done"))
    await until(lambda: _state_is(queue, bad_id, "dlq"))

    words = text_of((await client.get("/admin/")).text)
    assert "Boom bus jobs 0 0 1 —" in words

    done = await client.get(f"/admin/jobs/{ok_id}")
    assert done.status_code == 200
    assert 'id="job-state">done<' in done.text
    assert '"sent": "ada@example.com"' in done.text.replace("&#34;", '"')
    assert "Dead letter" not in done.text

    dead = await client.get(f"/admin/jobs/{bad_id}?job=Boom")
    assert dead.status_code == 200
    words = text_of(dead.text)
    assert 'id="job-state">dlq<' in dead.text
    assert "RuntimeError: boom 7" in words
    assert "attempts 1" in words
    assert 'href="/admin/dlq/Boom"' in dead.text
    assert "Dead letter error RuntimeError : boom 7 failed" in words  # DeadLetters.get
    assert "&#34;n&#34;: 7" in dead.text and 'name="id" value="' + bad_id in dead.text

    hit = await client.get(f"/admin/search?id={bad_id}")
    assert hit.status_code == 303 and hit.headers["location"] == f"/admin/jobs/{bad_id}?job=Boom"
    miss = await client.get("/admin/search?id=no-such-job")
    assert miss.status_code == 404
    words = text_of(miss.text)
    assert "No job has the id no-such-job in any job queue's status records." in words
    assert "kept for its class's keep_status_s after its last change" in words
    assert "Boom 1 d (86400 s)" in words
    unknown = await client.get("/admin/jobs/no-such-job")
    assert unknown.status_code == 404 and "No job has the id" in unknown.text

    slashed = await queue.enqueue(Boom, {"to": "bo@example.com"}, id="tenant/7")
    found = await client.get("/admin/search?id=tenant/7")
    assert found.status_code == 303
    assert found.headers["location"] == "/admin/jobs/tenant%2F7?job=Boom"
    page = await client.get(found.headers["location"])
    assert page.status_code == 200 and "tenant/7" in page.text and slashed == "tenant/7"


async def _state_is(queue: Any, job_id: str, state: str) -> bool:
    status = await queue.status(Boom, job_id)
    return status is not None and status.state == state


async def test_the_dead_letters_page_by_50_retry_one_and_purge(
    client: httpx.AsyncClient, config: Config
) -> None:
    await login(client)
    none = await client.get("/admin/dlq/Boom")
    assert "No dead letters: every failed job was retried or succeeded." in none.text
    assert "Purge all" not in none.text

    queue = job_queue(client.app, "jobs")  # type: ignore[attr-defined]
    ids = await queue.enqueue_many(Boom, [{"fail": True, "n": n} for n in range(120)])
    async with job_worker(config):
        await dead_letters(client, 120)

    seen: list[str] = []
    pages = []
    url: str | None = "/admin/dlq/Boom"
    while url:
        page = await client.get(url)
        assert page.status_code == 200
        found = re.findall(r'<li class="adm-card" data-id="([^"]+)"', page.text)
        pages.append(len(found))
        seen += found
        older = re.search(r'<a href="([^"]+)" rel="next" id="dlq-older">', page.text)
        url = older.group(1).replace("&amp;", "&") if older else None
    assert pages == [50, 50, 20]
    assert len(set(seen)) == 120 and set(seen) == set(ids)
    assert seen[0] == ids[-1] or seen[0] in ids  # newest first (the workers end in any order)
    first = (await client.get("/admin/dlq/Boom")).text
    assert 'id="dlq-count">120<' in first
    assert "RuntimeError" in first and "&#34;fail&#34;: true" in first

    Boom.failing = False
    retried = seen[-1]
    async with job_worker(config):
        answer = await form_post(client, "/admin/dlq/Boom/retry", id=retried)
        assert answer.status_code == 303 and answer.headers["location"] == "/admin/dlq/Boom"
        after = await client.get("/admin/dlq/Boom")
        assert f"Dead letter {retried} requeued" in after.text
        assert 'id="dlq-count">119<' in after.text
        await until(lambda: _state_is(queue, retried, "done"))
    assert (await queue.stats(Boom)).dlq == 119

    deleted = await form_post(client, "/admin/dlq/Boom/delete", id=seen[0])
    assert deleted.status_code == 303
    after = await client.get("/admin/dlq/Boom")
    assert f"Dead letter {seen[0]} deleted." in after.text
    assert 'id="dlq-count">118<' in after.text and f'data-id="{seen[0]}"' not in after.text
    again = await form_post(client, "/admin/dlq/Boom/delete", id=seen[0])
    assert again.status_code == 303
    assert f"No dead letter {seen[0]}: already gone." in (await client.get("/admin/dlq/Boom")).text

    confirm = await client.get("/admin/dlq/Boom/purge")
    assert confirm.status_code == 200
    assert "This deletes all 118 dead letters of Boom, for good" in text_of(confirm.text)
    assert (await queue.stats(Boom)).dlq == 118  # the confirm step deletes nothing
    purged = await form_post(client, "/admin/dlq/Boom/purge")
    assert purged.status_code == 303
    page = await client.get("/admin/dlq/Boom")
    assert "Purged 118 dead letters of Boom." in page.text
    assert "No dead letters: every failed job was retried or succeeded." in page.text
    assert (await queue.stats(Boom)).dlq == 0


async def test_pause_resume_and_run_now_a_schedule(client: httpx.AsyncClient) -> None:
    await login(client)
    paused = await form_post(client, "/admin/schedules/Tidy/pause")
    assert paused.status_code == 303 and paused.headers["location"] == "/admin/#schedules"
    page = (await client.get("/admin/")).text
    assert "Tidy: Paused by demo since" in page
    assert re.search(r'data-schedule="Tidy">.*?adm-warn">paused<', page, re.S)
    assert ">Resume</button>" in page

    resumed = await form_post(client, "/admin/schedules/Tidy/resume")
    assert resumed.status_code == 303
    page = (await client.get("/admin/")).text
    assert "Tidy: Ticking; resumed by demo at" in page
    assert ">Pause</button>" in page

    ran = await form_post(client, "/admin/schedules/Tidy/run")
    assert ran.status_code == 303
    page = (await client.get("/admin/")).text
    assert "Tidy: manual tick ran." in page
    manual = re.findall(r'<tr data-key="(\w+) [^"]+">', page)
    assert manual[:3] == ["manual", "resume", "pause"]  # the audit, newest first
    missing = await form_post(client, "/admin/schedules/Nope/run")
    assert missing.status_code == 404


def test_the_rate_is_what_left_the_lane_per_second_between_two_reads() -> None:
    from mega.drivers.base import LaneStats
    from mega.web.admin import fleet

    now = [100.0]
    sampler = fleet.RateSampler(clock=lambda: now[0])
    key = ("job", "jobs", "Boom")
    assert sampler.rate(key, LaneStats(5, 1, 0, stored=10)) is None  # no earlier read
    now[0] += 0.5
    assert sampler.rate(key, LaneStats(0, 0, 0, stored=10)) is None  # too soon to measure
    now[0] += 1.5
    assert sampler.rate(key, LaneStats(2, 0, 0, stored=30)) == 12.0  # (28 - 4) left in 2 s
    assert fleet.rate_text(12.0) == "12/s" and fleet.rate_text(0.5) == "30/min"
    assert fleet.rate_text(None) == "—" and fleet.rate_text(0) == "0/s"
    stats = LaneStats(1, 0, 0, oldest_ms=1_000_000, stored=1)
    assert fleet.oldest_text(stats, now_ms=1_000_000 + 185_000) == "3 min"
    assert fleet.oldest_text(LaneStats(0, 0, 0)) == "—"


async def test_a_workflow_page_shows_each_step_and_links_its_jobs(
    client: httpx.AsyncClient, config: Config
) -> None:
    await login(client)
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    fan = group([Boom.step({"to": "ada@example.com"}), Boom.step({"fail": True, "n": 2})])
    workflow_id = await fan.then(Boom.step()).enqueue(ctx, id="weekly-digest")
    queue = job_queue(client.app, "jobs")  # type: ignore[attr-defined]

    async def ended() -> bool:
        status = await queue.status(workflow_id)
        return status is not None and status.final

    async with job_worker(config):
        await until(ended)
    page = await client.get("/admin/workflows/weekly-digest")
    assert page.status_code == 200
    assert 'id="workflow-state">done<' in page.text
    words = text_of(page.text)
    assert "kind group: members at once, then a callback" in words
    assert "steps ended 2 of 2" in words
    assert '1 Boom done 1 {"sent": "ada@example.com"}' in words.replace("&#34;", '"')
    assert "2 Boom dlq 1 RuntimeError: boom 2" in words
    assert 'callback Boom done 1 {"sent": "nobody"}' in words.replace("&#34;", '"')
    member = "wf~weekly-digest~1"
    assert f'href="/admin/jobs/{member}?job=Boom"' in page.text
    step_page = await client.get(f"/admin/jobs/{member}?job=Boom")
    assert "It is step 2 of workflow weekly-digest ." in text_of(step_page.text)
    assert 'href="/admin/workflows/weekly-digest"' in step_page.text
    hit = await client.get("/admin/search?id=weekly-digest")
    assert hit.status_code == 303 and hit.headers["location"] == "/admin/workflows/weekly-digest"
    missing = await client.get("/admin/workflows/no-such-workflow")
    assert missing.status_code == 404 and "No job has the id" in missing.text


async def test_a_large_payload_is_shown_cut_with_a_link_to_the_whole_record(
    client: httpx.AsyncClient, config: Config
) -> None:
    await login(client)
    queue = job_queue(client.app, "jobs")  # type: ignore[attr-defined]
    big = await queue.enqueue(Boom, {"fail": True, "pad": "y" * 200_000})
    small = await queue.enqueue(Boom, {"fail": True, "n": 1})
    async with job_worker(config):
        await dead_letters(client, 2)
    page = await client.get("/admin/dlq/Boom")
    assert page.status_code == 200 and len(page.text) < 80_000  # not the 200 KB payload
    link = f'<a href="/admin/dlq/Boom/record?id={big}">the whole record as JSON</a>'
    assert text_of(page.text).count("Shown cut at 16 KB") == 1 and link in page.text
    job_page = await client.get(f"/admin/jobs/{big}?job=Boom")
    assert len(job_page.text) < 80_000 and link in job_page.text
    whole = await client.get(f"/admin/dlq/Boom/record?id={big}")
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/json"
    assert whole.json()["payload"]["pad"] == "y" * 200_000
    small_page = await client.get(f"/admin/jobs/{small}?job=Boom")
    assert "Shown cut" not in small_page.text
    missing = await client.get(
        "/admin/dlq/Boom/record?id=nope", headers={"accept": "application/json"}
    )
    assert missing.status_code == 404
