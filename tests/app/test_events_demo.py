"""/demo/events and its JSON with what `mega worker` runs (relay, listeners, jobs) in process:
a committed signup reaches every listener group once, a rolled-back one none; the CRM group
dead-letters fail...@ addresses and requeue works; the relay's pause switch; bad input."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.events.listeners import STATS_KEY
from app.jobs.signup import ACTIVATED_KEY
from mega.config import Config
from tests.factories import authed, csrf_from, login, web_client, worker_host

GROUPS = ["WelcomeEmailListener", "SignupStatsListener", "WelcomeCreditListener", "CrmSyncListener"]

EMAIL = "is not a valid e-mail address (one like name@example.com, at most 254 characters)"


async def state(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/demo/events")
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()["data"]
    return data


async def until(
    client: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool], timeout_s: float = 20
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        data = await state(client)
        if check(data):
            return data
        assert asyncio.get_running_loop().time() < deadline, f"never happened: {data}"
        await asyncio.sleep(0.1)


async def sign_up(
    client: httpx.AsyncClient, headers: dict[str, str], email: str, mode: str = "ok"
) -> dict[str, Any]:
    response = await client.post(
        "/api/demo/events/signup", json={"email": email, "mode": mode}, headers=headers
    )
    assert response.status_code in (200, 201), response.text
    data: dict[str, Any] = response.json()["data"]
    return data


def statuses(data: dict[str, Any], event_id: str) -> dict[str, str]:
    event = next(e for e in data["events"] if e["id"] == event_id)
    return {**event["listeners"], "event": event["status"]}


def job_of(data: dict[str, Any], event_id: str) -> dict[str, str]:
    """The signup's own job (ActivateAccountJob, enqueued through the outbox) as the page has it."""
    job: dict[str, str] = next(e for e in data["events"] if e["id"] == event_id)["job"]
    return job


async def test_anonymous_is_refused(config: Config) -> None:
    async with web_client(config) as client:
        assert (await client.get("/api/demo/events")).status_code == 401
        response = await client.post("/api/demo/events/signup", json={"email": "a@b.co"})
        assert response.status_code == 401


async def test_a_committed_signup_reaches_every_group_once_a_rolled_back_one_none(
    config: Config,
) -> None:
    async with web_client(config) as client, worker_host(config):
        headers = await authed(client, "/demo/events")
        committed = await sign_up(client, headers, "ada@example.com")
        assert committed["committed"] is True and committed["signup_id"] == 1
        rolled_back = await sign_up(client, headers, "bob@example.org", mode="rollback")
        assert rolled_back == {"committed": False, "signup_id": None, "event_id": None}
        event_id = committed["event_id"]
        data = await until(
            client,
            lambda d: (
                set(statuses(d, event_id).values()) == {"done", "published"}
                and job_of(d, event_id)["state"] == "done"
            ),
        )
        assert [e["email"] for e in data["events"]] == ["ada@example.com"]  # bob: never
        # The signup's own job ran once, for ada's signup only (bob's rolled back with it).
        assert job_of(data, event_id) == {
            "id": "a" + event_id[:11],
            "name": "ActivateAccountJob",
            "state": "done",
        }
        # One zone on the page, UTC, and said so.
        assert data["timezone"] == "UTC"
        at = datetime.fromisoformat(data["events"][0]["at"])
        assert at.utcoffset() == timedelta(0)
        assert abs(datetime.now(UTC) - at) < timedelta(minutes=1)
        assert data["outbox"] == {"pending": 0, "published": 2, "lag_ms": 0.0, "paused": False}
        counts = {g["group"]: (g["done"], g["failed"], g["dlq"]) for g in data["listeners"]}
        assert counts == dict.fromkeys(GROUPS, (1, 0, 0))
        redis = client.app.state.ctx.cache("main").native
        assert await redis.hgetall(STATS_KEY) == {"example.com": "1"}
        assert list(await redis.hgetall(ACTIVATED_KEY)) == ["1"]  # signup 1 activated, alone
        assert data["credits"] == {"rows": 1}  # WelcomeCreditListener's row, in the database
        # The welcome email is a job: it ran, listed on the jobs page.
        jobs = (await client.get("/api/demo/jobs")).json()["data"]["jobs"]
        deadline = asyncio.get_running_loop().time() + 20
        while not any(j["to"] == "ada@example.com" and j["state"] == "done" for j in jobs):
            assert asyncio.get_running_loop().time() < deadline, jobs
            await asyncio.sleep(0.1)
            jobs = (await client.get("/api/demo/jobs")).json()["data"]["jobs"]
        assert [j["id"] for j in jobs] == ["w" + event_id[:11]]


async def test_the_crm_group_dead_letters_and_requeue_brings_it_back(config: Config) -> None:
    async with web_client(config) as client, worker_host(config):
        headers = await authed(client, "/demo/events")
        event_id = (await sign_up(client, headers, "fail.fast@example.com"))["event_id"]
        data = await until(client, lambda d: statuses(d, event_id)["CrmSyncListener"] == "dlq")
        assert statuses(data, event_id) == {
            "WelcomeEmailListener": "done",
            "SignupStatsListener": "done",
            "WelcomeCreditListener": "done",
            "CrmSyncListener": "dlq",
            "event": "published",
        }
        [dead] = data["dlq"]
        assert (dead["group"], dead["id"], dead["attempts"]) == ("CrmSyncListener", event_id, 3)
        assert dead["error"] == "CrmRejected: the CRM rejected fail.fast@example.com"
        failed_at = datetime.fromisoformat(dead["failed_at"])
        assert failed_at.utcoffset() == timedelta(0)
        assert abs(datetime.now(UTC) - failed_at) < timedelta(minutes=1)
        crm = next(g for g in data["listeners"] if g["group"] == "CrmSyncListener")
        assert (crm["failed"], crm["dlq"]) == (3, 1)

        response = await client.post(
            "/api/demo/events/dlq/requeue",
            json={"group": "CrmSyncListener", "id": event_id},
            headers=headers,
        )
        assert response.json()["data"] == {"requeued": 1}
        # It fails again (the address has not changed) and comes back to the DLQ: 3 more tries.
        data = await until(
            client,
            lambda d: (
                next(g for g in d["listeners"] if g["group"] == "CrmSyncListener")["failed"] == 6
                and len(d["dlq"]) == 1
            ),
        )
        others = {
            g["group"]: g["done"] for g in data["listeners"] if g["group"] != "CrmSyncListener"
        }
        assert others == {  # untouched
            "WelcomeEmailListener": 1,
            "SignupStatsListener": 1,
            "WelcomeCreditListener": 1,
        }
        missing = await client.post(
            "/api/demo/events/dlq/requeue",
            json={"group": "CrmSyncListener", "id": "nope"},
            headers=headers,
        )
        assert missing.status_code == 404


async def test_a_paused_relay_lets_rows_pile_up_then_they_drain(config: Config) -> None:
    async with web_client(config) as client, worker_host(config):
        headers = await authed(client, "/demo/events")
        paused = await client.post("/api/demo/events/relay", json={"paused": True}, headers=headers)
        assert paused.json()["data"] == {"paused": True}
        ids = [(await sign_up(client, headers, f"u{n}@example.com"))["event_id"] for n in range(3)]
        # The lag is the oldest waiting row's age: it grows while the relay is paused, over
        # several of its polls (every 0.1 s) that leave the rows where they are.
        data = await until(client, lambda d: d["outbox"]["lag_ms"] >= 400)
        # Each signup wrote two rows: its event and its own job (outbox.enqueue).
        assert data["outbox"]["pending"] == 6 and data["outbox"]["paused"] is True
        lag = data["outbox"]["lag_ms"]
        await until(client, lambda d: d["outbox"]["lag_ms"] >= lag + 250)
        assert {statuses(data, i)["event"] for i in ids} == {"pending"}
        # Nothing is published yet: every group waits for the relay, none has it queued.
        for i in ids:
            assert {g: s for g, s in statuses(data, i).items() if g != "event"} == dict.fromkeys(
                GROUPS, "waiting"
            )
        assert {job_of(data, i)["state"] for i in ids} == {"waiting"}  # not enqueued either
        await client.post("/api/demo/events/relay", json={"paused": False}, headers=headers)
        data = await until(
            client,
            lambda d: (
                d["outbox"]["pending"] == 0
                and all(set(statuses(d, i).values()) == {"done", "published"} for i in ids)
                and all(job_of(d, i)["state"] == "done" for i in ids)
            ),
        )
        assert data["outbox"]["published"] == 6


@pytest.mark.parametrize(
    "body",
    [
        {"email": "not-an-address", "mode": "ok"},
        {"email": "ada@example.com", "mode": "later"},
        {"mode": "ok"},
        {"email": "a" * 250 + "@example.com"},
        {"email": "ada@example.com\\nX: y"},
    ],
)
async def test_bad_input_is_422_and_writes_nothing(config: Config, body: dict[str, Any]) -> None:
    async with web_client(config) as client:
        headers = await authed(client, "/demo/events")
        response = await client.post("/api/demo/events/signup", json=body, headers=headers)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "validation_failed" and error["fields"]
        data = await state(client)
        assert data["events"] == [] and data["outbox"]["pending"] == 0


async def test_the_page_and_its_forms_work_without_javascript(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        page = await client.get("/demo/events")
        assert page.status_code == 200 and "Sign someone up" in page.text
        token = csrf_from(page.text)
        sent = await client.post(
            "/demo/events", data={"email": "grace@example.com", "mode": "ok", "csrf_token": token}
        )
        assert sent.status_code == 303 and sent.headers["location"] == "/demo/events"
        assert "committed" in (await client.get("/demo/events")).text  # the one-time message
        # Text in the query string is never shown: a link cannot make the page say anything.
        forged = await client.get("/demo/events?notice=Your+account+is+locked")
        assert "Your account is locked" not in forged.text
        bad = await client.post(
            "/demo/events", data={"email": "nope", "mode": "ok", "csrf_token": token}
        )
        assert bad.status_code == 422
        assert f'<span class="field-error" id="error-email">{EMAIL}</span>' in bad.text
        assert "Input should be" not in bad.text and "value is not a valid" not in bad.text
        assert [e["email"] for e in (await state(client))["events"]] == ["grace@example.com"]


@pytest.mark.parametrize(
    "email",
    [
        "not an address",
        "",
        "Ada, L <ada@example.com>",  # email-validator: "the display name contains invalid ..."
        "x" * 64 + "@" + ".".join(c * 60 for c in "def") + ".example.com",  # too long
    ],
)
async def test_bad_addresses_get_a_plain_sentence(config: Config, email: str) -> None:
    async with web_client(config) as client:
        headers = await authed(client, "/demo/events")
        response = await client.post(
            "/api/demo/events/signup", json={"email": email}, headers=headers
        )
        assert response.status_code == 422
        assert response.json()["error"]["fields"] == {"email": EMAIL}


async def test_the_page_teaches_its_failure_modes(config: Config) -> None:
    async with web_client(config) as client:
        await login(client)
        page = (await client.get("/demo/events")).text
        assert "Try it" in page and 'href="/demo/guide/events"' in page
        for path in (
            "app/events/listeners.py",
            "mega/transactional/relay.py",
            "mega/transactional/store.py",
        ):
            assert f'href="/demo/source?path={path}"' in page
        assert "Times on this page are in <b>UTC</b>" in page
