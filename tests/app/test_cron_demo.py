"""/demo/cron and its JSON: state, manual ticks through the lock, and refusal when anonymous."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest
import redis.asyncio as redis

from app.services.cron_counter import COUNT_KEY, FENCE_KEY, HISTORY_KEY, read_state, record_run
from tests.factories import csrf_from, login, sample_config_for, web_client


@pytest.fixture
async def fresh_redis(redis_url: str):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    await client.delete(
        COUNT_KEY, HISTORY_KEY, FENCE_KEY, "mega:schedule:CronCounterSchedule:running"
    )
    yield client
    await client.aclose()


async def test_anonymous_is_refused(tmp_path: Path, nats_url: str, redis_url: str) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        assert (await client.get("/api/demo/cron")).status_code == 401
        assert (await client.get("/demo/cron")).status_code == 303
        page = await client.get("/login")
        posted = await client.post(
            "/api/demo/cron/run", json={}, headers={"X-CSRF-Token": csrf_from(page.text)}
        )
        assert posted.status_code == 401


async def test_state_and_manual_run(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        state = (await client.get("/api/demo/cron")).json()["data"]
        assert state["count"] == 0 and state["history"] == []
        assert state["cron"] == "*/30 * * * * *" and state["timezone"] == "Asia/Seoul"
        assert len(state["next_runs"]) == 5
        for at in state["next_runs"]:
            instant = datetime.fromisoformat(at)
            assert instant.utcoffset().total_seconds() == 9 * 3600  # Seoul, +09:00
            assert instant.second in (0, 30)

        token = csrf_from((await client.get("/demo/cron")).text)
        ran = await client.post("/api/demo/cron/run", json={}, headers={"X-CSRF-Token": token})
        assert ran.status_code == 200 and ran.json()["data"] == {"ran": True}

        state = (await client.get("/api/demo/cron")).json()["data"]
        assert state["count"] == 1
        assert [item["source"] for item in state["history"]] == ["manual"]
        assert state["ticks"][0]["source"] == "manual" and state["ticks"][0]["winner"]
        # One time zone on the page, the schedule's; and the fence each run got.
        for at in [state["history"][0]["at"], state["ticks"][0]["instant"]]:
            assert datetime.fromisoformat(at).utcoffset().total_seconds() == 9 * 3600  # type: ignore[union-attr]
        assert state["ticks"][0]["fence"] >= int(time.time() * 1000) - 60_000

        # The page shows it too, and its no-JS form posts, redirects and gets.
        form = await client.post("/demo/cron/run", data={"csrf_token": token})
        assert form.status_code == 303 and form.headers["location"] == "/demo/cron"
        page = await client.get(form.headers["location"])
        assert "Manual tick ran." in page.text
        again = await client.get("/demo/cron")  # a flash is shown once
        assert "Manual tick ran." not in again.text
        assert (await read_state(fresh_redis))["count"] == 2


async def test_manual_run_skips_while_a_run_holds_the_guard(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        await fresh_redis.set("mega:schedule:CronCounterSchedule:running", "someone", px=5000)
        token = csrf_from((await client.get("/demo/cron")).text)
        skipped = await client.post("/api/demo/cron/run", json={}, headers={"X-CSRF-Token": token})
        data = skipped.json()["data"]
        assert data["ran"] is False and "overlap" in data["reason"]
        assert (await read_state(fresh_redis))["count"] == 0


async def test_a_stale_fence_cannot_overwrite_a_newer_run(fresh_redis) -> None:
    now = datetime.now().astimezone()
    assert await record_run(fresh_redis, at=now, source="schedule", fence=7)
    assert not await record_run(fresh_redis, at=now, source="schedule", fence=6)
    assert await record_run(fresh_redis, at=now, source="manual", fence=8)
    assert (await read_state(fresh_redis))["count"] == 2
