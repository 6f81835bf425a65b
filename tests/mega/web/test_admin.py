"""The admin pages (mega.web.admin) mounted by an app on the framework alone: the login, the
overview of a known state, one job's life, the search, the dead-letter browser's paging, retry
and purge, and the schedules' pause, resume and run now. Each test has its own NATS and Redis;
a JobRunner runs in the test's process."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from mega import audit, group
from mega.config import Config, load_config
from mega.web import ensure_user, job_queue
from mega.web.tokens import Scope, create_token
from tests.factories import WebClient, csrf_from, job_worker, login, web_client, write_config
from tests.mega.web.admin_site import ADMIN_DECLARATIONS, Boom

SITE = "tests.mega.web.admin_site:create_app"


@pytest.fixture
def config(
    tmp_path: Path, nats_factory: Callable[[], Any], redis_factory: Callable[[], Any]
) -> Config:
    path = write_config(
        tmp_path,
        nats_url=nats_factory().url,
        redis_url=redis_factory().url,
        body=ADMIN_DECLARATIONS,
        web_app=SITE,
        roles={"demo": "admin", "otto": "operator"},
    )
    return load_config(path)


@pytest.fixture
async def client(config: Config) -> AsyncIterator[WebClient]:
    Boom.failing = True
    async with web_client(config) as client:
        yield client


async def enqueue(client: WebClient, payload: dict[str, Any]) -> str:
    return str(await job_queue(client.app, "jobs").enqueue(Boom, payload))


async def until(check: Callable[[], Any], timeout_s: float = 20) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)
    return value


async def dead_letters(client: WebClient, count: int) -> None:
    queue = job_queue(client.app, "jobs")

    async def stored() -> bool:
        return (await queue.stats(Boom)).dlq == count

    await until(stored)


async def form_post(client: WebClient, path: str, **fields: str) -> httpx.Response:
    token = csrf_from((await client.get("/admin/")).text)
    return await client.post(path, data={"csrf_token": token, **fields})


def text_of(html: str) -> str:
    """The page's words, tags and surplus spaces removed (for sentences across elements)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


async def test_the_pages_need_a_login_or_an_api_token(client: WebClient) -> None:
    for path in ("/admin/", "/admin/dlq/Boom", "/admin/jobs/x", "/admin/search?id=x"):
        page = await client.get(path)
        assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
        api = await client.get(path, headers={"Accept": "application/json"})
        assert api.status_code == 401
    refused = await client.post("/admin/schedules/Tidy/pause")
    assert refused.status_code == 403  # no session: no CSRF token either

    db = client.app.state.ctx.db
    scopes: tuple[Scope, ...] = ("console:read", "console:operate")
    token = await db.run(lambda session: create_token(session, "ops-bot", scopes=scopes))
    bearer = {"Authorization": f"Bearer {token}"}
    overview = await client.get("/admin/", headers=bearer)
    assert overview.status_code == 200 and "Job queues" in overview.text
    assert "Log out" not in overview.text  # a token has no session to end
    paused = await client.post("/admin/schedules/Tidy/pause", headers=bearer)
    assert paused.status_code == 303  # a token needs no CSRF token
    wrong = await client.get("/admin/", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code in (303, 401)


async def test_the_overview_a_job_page_and_the_search(client: WebClient, config: Config) -> None:
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
    queue = job_queue(client.app, "jobs")
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
    client: WebClient, config: Config
) -> None:
    await login(client)
    none = await client.get("/admin/dlq/Boom")
    assert "No dead letters: every failed job was retried or succeeded." in none.text
    assert "Purge all" not in none.text

    queue = job_queue(client.app, "jobs")
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


async def test_pause_resume_and_run_now_a_schedule(client: WebClient) -> None:
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
    client: WebClient, config: Config
) -> None:
    await login(client)
    ctx = client.app.state.ctx
    fan = group([Boom.step({"to": "ada@example.com"}), Boom.step({"fail": True, "n": 2})])
    workflow_id = await fan.then(Boom.step()).enqueue(ctx, id="weekly-digest")
    queue = job_queue(client.app, "jobs")

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
    client: WebClient, config: Config
) -> None:
    await login(client)
    queue = job_queue(client.app, "jobs")
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


async def test_viewers_read_operators_retry_and_pause_admins_purge_and_each_is_audited(
    client: WebClient, config: Config
) -> None:
    """The console's access levels (auth.roles; a user it does not name is a viewer): a
    refused action is a 403 page that says why and changes nothing; each done one is an
    audit row shown on its job's page and its schedule's card."""
    db = client.app.state.ctx.db
    for name in ("vera", "otto"):
        ensure_user(db, name, f"{name}-password-1")
    queue = job_queue(client.app, "jobs")
    ids = await queue.enqueue_many(Boom, [{"fail": True, "n": n} for n in range(3)])
    async with job_worker(config):
        await dead_letters(client, 3)

    await login(client, "vera", "vera-password-1")  # not in auth.roles: a viewer
    assert (await client.get("/admin/")).status_code == 200
    assert (await client.get("/admin/dlq/Boom")).status_code == 200
    refused = await form_post(client, "/admin/dlq/Boom/retry", id=ids[0])
    assert refused.status_code == 403 and "Not allowed" in refused.text
    assert "vera may not do this: it takes the operator role" in text_of(refused.text)
    assert "vera has the viewer role (set by auth.roles in the config)" in text_of(refused.text)
    assert (await form_post(client, "/admin/schedules/Tidy/pause")).status_code == 403
    assert (await client.get("/admin/dlq/Boom/purge")).status_code == 403
    assert (await queue.stats(Boom)).dlq == 3 and not (await queue.paused(Boom)).paused

    await client.post("/logout", data={"csrf_token": csrf_from((await client.get("/admin/")).text)})
    await login(client, "otto", "otto-password-1")  # an operator
    retried = await form_post(client, "/admin/dlq/Boom/retry", id=ids[0])
    assert retried.status_code == 303
    assert (await form_post(client, "/admin/schedules/Tidy/pause")).status_code == 303
    no_purge = await form_post(client, "/admin/dlq/Boom/purge")
    assert no_purge.status_code == 403 and "it takes the admin role" in text_of(no_purge.text)
    no_delete = await form_post(client, "/admin/dlq/Boom/delete", id=ids[1])
    assert no_delete.status_code == 403 and (await queue.stats(Boom)).dlq == 2

    await client.post("/logout", data={"csrf_token": csrf_from((await client.get("/admin/")).text)})
    await login(client)  # demo: an admin (tests.factories' auth.roles)
    assert (await form_post(client, "/admin/dlq/Boom/delete", id=ids[1])).status_code == 303
    assert (await form_post(client, "/admin/dlq/Boom/purge")).status_code == 303
    assert (await queue.stats(Boom)).dlq == 0

    job_page = text_of((await client.get(f"/admin/jobs/{ids[0]}?job=Boom")).text)
    assert "Console actions" in job_page and "otto : retry" in job_page
    deleted_page = text_of((await client.get(f"/admin/jobs/{ids[1]}?job=Boom")).text)
    assert "demo : delete" in deleted_page and "retry" not in deleted_page.split("Console")[-1]
    overview = text_of((await client.get("/admin/")).text)
    assert "otto : pause" in overview
    rows = await db.run(lambda session: audit.entries(session))
    assert [(r.actor, r.action, r.target, r.ids, r.detail) for r in rows] == [
        ("demo", "purge", "job:Boom", (), "1 dead letter"),
        ("demo", "delete", "job:Boom", (ids[1],), ""),
        ("otto", "pause", "schedule:Tidy", (), ""),
        ("otto", "retry", "job:Boom", (ids[0],), ""),
    ]


async def test_a_tokens_scopes_say_what_it_may_do_and_an_expired_one_is_refused(
    client: WebClient, caplog: pytest.LogCaptureFixture
) -> None:
    db = client.app.state.ctx.db

    async def made(
        name: str, *scopes: Scope, expires_in: timedelta | None = None
    ) -> dict[str, str]:
        token = await db.run(lambda s: create_token(s, name, scopes=scopes, expires_in=expires_in))
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    writer = await made("writer", "jobs:enqueue")
    reader = await made("reader", "console:read")
    operator = await made("operator", "console:read", "console:operate")
    read = await client.get("/admin/", headers=writer)
    assert read.status_code == 403
    assert read.json()["error"]["message"] == (
        "API token 'writer' may not read: it lacks the scope console:read"
    )
    assert (await client.get("/admin/", headers=reader)).status_code == 200
    no_pause = await client.post("/admin/schedules/Tidy/pause", headers=reader)
    assert no_pause.status_code == 403 and "lacks the scope jobs:enqueue" in no_pause.text
    paused = await client.post("/admin/schedules/Tidy/pause", headers=operator)
    assert paused.status_code == 303
    no_purge = await client.post("/admin/dlq/Boom/purge", headers=operator)
    assert no_purge.status_code == 403
    assert "token:operator may not do this: it takes the admin role" in no_purge.text
    assert "(set by its console:* scope)" in no_purge.text

    ended = await made("ended", "console:read", expires_in=timedelta(seconds=-1))
    with caplog.at_level(logging.WARNING, logger="mega.web.auth"):
        refused = await client.get("/admin/", headers=ended)
    assert refused.status_code == 401
    assert "API token 'ended' expired at " in refused.json()["error"]["message"]
    assert "API token 'ended' expired at" in caplog.text and "from 10.1.2.3" in caplog.text


async def test_wrong_tokens_are_limited_per_address_and_logged_without_the_token(
    tmp_path: Path,
    nats_factory: Callable[[], Any],
    redis_factory: Callable[[], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_config(
        tmp_path,
        nats_url=nats_factory().url,
        redis_url=redis_factory().url,
        body=ADMIN_DECLARATIONS,
        web_app=SITE,
    )
    async with web_client(load_config(path)) as client:
        db = client.app.state.ctx.db
        good = await db.run(lambda s: create_token(s, "good"))
        json_only = {"Accept": "application/json"}
        with caplog.at_level(logging.WARNING, logger="mega.web.auth"):
            # As failed logins: after the second, a delay (1 s, doubling); past
            # auth.login_max_failures in auth.login_window_s, the window's end.
            for n in range(2):
                wrong = {"Authorization": f"Bearer mega_guess{n}", **json_only}
                assert (await client.get("/admin/", headers=wrong)).status_code == 401
            third = {"Authorization": "Bearer mega_guess2", **json_only}
            throttled = await client.get("/admin/", headers=third)
            assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
            assert "too many wrong API tokens from this address" in throttled.text
            # The address is held back, even with a good token, until its delay ends.
            held = await client.get("/admin/", headers={"Authorization": f"Bearer {good}"})
            assert held.status_code == 429
        lines = [r.getMessage() for r in caplog.records]
        assert lines.count("wrong or revoked API token from 10.1.2.3") == 2
        assert (
            lines.count("API token refused unread from 10.1.2.3: too many wrong tokens lately") == 2
        )
        assert not any("mega_guess" in line or good in line for line in lines)
