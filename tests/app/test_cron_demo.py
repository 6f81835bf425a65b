"""/demo/cron and its JSON: state, manual ticks through the lock (with a hold that makes the
next tick skip on the overlap guard), the lock skip of a second scheduler, bad input, and
refusal when anonymous."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis.asyncio as redis

from app.routes.api_cron import HOLDING
from app.schedules.cron_counter import CronCounterSchedule
from app.services.cron_counter import COUNT_KEY, FENCE_KEY, HISTORY_KEY, read_state, record_run
from mega import Scheduler, audit
from mega.schedules.schedule import LockSettings
from mega.web import ensure_user
from tests.factories import DEMO_USER, csrf_from, login, sample_config_for, web_client

PREFIX = "mega:schedule:{CronCounterSchedule}"
# The schedule's own keys under PREFIX: its overlap guard, its audit, its pause record.
KEYS = ("running", "audit", "paused")
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "schedules.md"


@pytest.fixture
async def fresh_redis(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    await client.delete(COUNT_KEY, HISTORY_KEY, FENCE_KEY, *(f"{PREFIX}:{key}" for key in KEYS))
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
        for change in ("pause", "resume"):
            refused = await client.post(
                f"/api/demo/cron/{change}", headers={"X-CSRF-Token": csrf_from(page.text)}
            )
            assert refused.status_code == 401


async def test_state_and_manual_run(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        state = (await client.get("/api/demo/cron")).json()["data"]
        assert state["count"] == 0 and state["history"] == []
        assert state["cron"] == "*/30 * * * * *" and state["timezone"] == "Asia/Seoul"
        assert len(state["next_runs"]) == 5
        for at, utc in zip(state["next_runs"], state["next_runs_utc"], strict=True):
            instant = datetime.fromisoformat(at)
            offset = instant.utcoffset()
            assert offset is not None and offset.total_seconds() == 9 * 3600  # Seoul, +09:00
            assert instant.second in (0, 30)
            # The same instant in the page's one zone, UTC.
            assert datetime.fromisoformat(utc) == instant and utc.endswith("+00:00")

        token = csrf_from((await client.get("/demo/cron")).text)
        ran = await client.post("/api/demo/cron/run", json={}, headers={"X-CSRF-Token": token})
        assert ran.status_code == 200 and ran.json()["data"] == {"ran": True}

        state = (await client.get("/api/demo/cron")).json()["data"]
        assert state["count"] == 1
        assert [item["source"] for item in state["history"]] == ["manual"]
        assert state["ticks"][0]["source"] == "manual" and state["ticks"][0]["winner"]
        # One time zone on every page, UTC; and the fence each run got.
        for at in [state["history"][0]["at"], state["ticks"][0]["instant"]]:
            assert at.endswith("+00:00"), at
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
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        await fresh_redis.set(f"{PREFIX}:running", "someone", px=5000)
        token = csrf_from((await client.get("/demo/cron")).text)
        skipped = await client.post("/api/demo/cron/run", json={}, headers={"X-CSRF-Token": token})
        data = skipped.json()["data"]
        assert data["ran"] is False and "overlap" in data["reason"]
        assert (await read_state(fresh_redis))["count"] == 0


async def test_a_stale_fence_cannot_overwrite_a_newer_run(fresh_redis: redis.Redis) -> None:
    now = datetime.now().astimezone()
    assert await record_run(fresh_redis, at=now, source="schedule", fence=7)
    assert not await record_run(fresh_redis, at=now, source="schedule", fence=6)
    assert await record_run(fresh_redis, at=now, source="manual", fence=8)
    assert (await read_state(fresh_redis))["count"] == 2


class EverySecondCounter(CronCounterSchedule):
    """The sample's schedule, ticking every second on the same keys: its ticks meet the web
    app's manual ones at the same guard, and land in the same audit."""

    cron = "* * * * * *"
    timezone = "UTC"
    lock: ClassVar[LockSettings] = {"lock": "main", "ttl": 900, "key": PREFIX}


def plain_text(markup: str) -> str:
    """Text without tags or markdown emphasis, its whitespace collapsed: what a reader reads."""
    return " ".join(re.sub(r"<[^>]+>|[*`]", "", markup).split())


async def until_true(check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := await check()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)
    return found


async def test_a_held_manual_tick_makes_the_next_ticks_skip_on_the_overlap_guard(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        ctx = client.app.state.ctx
        # Two schedulers, as under `mega dev`: each tick has a winner and a loser.
        hosts = [
            Scheduler(ctx, instance_id=f"scheduler@test:{pid}:ab12").register(EverySecondCounter)
            for pid in (101, 102)
        ]
        for host in hosts:
            await host.start()
        try:

            async def state() -> dict[str, Any]:
                data: dict[str, Any] = (await client.get("/api/demo/cron")).json()["data"]
                return data

            async def contested() -> dict[str, Any] | None:
                ticks = (await state())["ticks"]
                return next((t for t in ticks if t["winner"] and t["skipped"]), None)

            # The lock skip: the loser of each tick says why, and the page lists both processes.
            tick = await until_true(contested, timeout_s=5)
            assert tick["winner"] in ("scheduler@test:101:ab12", "scheduler@test:102:ab12")
            assert [s["reason"] for s in tick["skipped"]] == ["claimed by another instance"]
            # Short names for a phone, the role and the pid to kill; the full id stays.
            assert tick["winner_label"] in ("scheduler ab12 (pid 101)", "scheduler ab12 (pid 102)")
            assert tick["skipped"][0]["label"].startswith("scheduler ab12 (pid 10")
            assert {s["pid"] for s in (await state())["schedulers"]} == {101, 102}

            token = csrf_from((await client.get("/demo/cron")).text)

            async def held_tick() -> dict[str, Any] | None:
                # A tick's own run may hold the guard for a few ms right then: try again.
                held = await client.post(
                    "/api/demo/cron/run", json={"hold_ms": 2500}, headers={"X-CSRF-Token": token}
                )
                found: dict[str, Any] = held.json()["data"]
                return found if found["ran"] else None

            started = time.time()
            data = await until_true(held_tick, timeout_s=3)
            assert time.time() - started < 1  # answers once the run holds, not when it ends
            assert (data["ran"], data["hold_ms"]) == (True, 2500)
            until = datetime.fromisoformat(data["hold_until"])
            assert data["hold_until"].endswith("+00:00")  # UTC, the page's one zone
            assert abs(until.timestamp() - (started + 2.5)) < 1
            # A second manual tick during the hold is skipped on the guard as well.
            again = await client.post(
                "/api/demo/cron/run", json={"hold_ms": 2500}, headers={"X-CSRF-Token": token}
            )
            assert again.json()["data"] == {
                "ran": False,
                "reason": "overlap: the previous run still runs",
            }

            async def released() -> bool:
                return not await fresh_redis.exists(f"{PREFIX}:running") and not HOLDING

            await until_true(released, timeout_s=6)
            assert time.time() - started >= 2.4  # held the whole time

            ticks = (await state())["ticks"]
            manual = next(t for t in ticks if t["source"] == "manual" and t["winner"] is not None)
            inside = [
                t
                for t in ticks
                if t["source"] == "schedule"
                and started + 0.2 < datetime.fromisoformat(t["instant"]).timestamp() < started + 2.3
            ]
            assert len(inside) >= 2
            for t in inside:  # one found the guard held, the other lost the claim first
                assert t["winner"] is None and t["fence"] is None
                assert sorted(s["reason"] for s in t["skipped"]) == [
                    "claimed by another instance",
                    "overlap: the previous run still runs",
                ]
            assert manual["winner"].startswith("web@")
            # The page shows those two reasons on that tick's row, and its text and the guide
            # say which scheduler records which, as the audit does.
            page_html = (await client.get("/demo/cron")).text
            key = f'data-key="{inside[0]["instant"]}|schedule"'
            row = page_html.split(key)[1].split("</tr>")[0]
            assert ">none<" in row and row.count("claimed by another instance") == 1
            assert row.count("overlap: the previous run still runs") == 1
            page = plain_text(page_html)
            assert (
                "the one that claimed the tick found the guard held and records overlap: the "
                "previous run still runs; the other lost the claim to it and records claimed by "
                "another instance"
            ) in page
            assert (
                "The scheduler that claimed the tick says overlap: the previous run still runs; "
                "the other, which lost the claim to it, says claimed by another instance"
            ) in page
            assert "each scheduler's line says overlap" not in page
            guide = plain_text(GUIDE.read_text())
            assert (
                'The one that claimed the tick found the guard held: "overlap: the previous run '
                'still runs". The other lost the claim to it, as on any tick: "claimed by another '
                'instance"'
            ) in guide
            # After the hold the guard is free again: ticks have winners.
            after = started + 3

            async def resumed() -> bool:
                return any(
                    t["winner"] and datetime.fromisoformat(t["instant"]).timestamp() > after
                    for t in (await state())["ticks"]
                )

            await until_true(resumed, timeout_s=5)
        finally:
            for host in hosts:
                await host.stop()


HOLD = "must be a whole number of milliseconds from 0 to 60000"


@pytest.mark.parametrize(
    ("hold", "message"),
    [
        (-1, HOLD),
        (-5, HOLD),
        (60_001, HOLD),
        (10**22, HOLD),  # 23 digits: the same sentence, not only "must be a whole number"
        ("35000", HOLD),
        (1.5, HOLD),
        (True, HOLD),
    ],
)
async def test_a_bad_hold_is_a_422_with_a_plain_field_error_and_runs_nothing(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis, hold: Any, message: str
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        token = csrf_from((await client.get("/demo/cron")).text)
        bad = await client.post(
            "/api/demo/cron/run", json={"hold_ms": hold}, headers={"X-CSRF-Token": token}
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["fields"] == {"hold_ms": message}
        assert (await read_state(fresh_redis))["count"] == 0


async def test_the_form_holds_and_words_bad_input(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        token = csrf_from((await client.get("/demo/cron")).text)
        bad = await client.post("/demo/cron/run", data={"csrf_token": token, "hold_ms": "soon"})
        assert bad.status_code == 422
        assert f'<span class="field-error" id="error-hold_ms">{HOLD}</span>' in bad.text
        assert 'value="soon"' in bad.text and 'aria-invalid="true"' in bad.text
        assert "Input should be" not in bad.text
        for typed in ("-5", "1" * 23, "²"):  # "²" is a digit to str.isdigit, not to int()
            bad = await client.post("/demo/cron/run", data={"csrf_token": token, "hold_ms": typed})
            assert bad.status_code == 422 and HOLD in bad.text
        assert (await read_state(fresh_redis))["count"] == 0

        held = await client.post("/demo/cron/run", data={"csrf_token": token, "hold_ms": "300"})
        assert held.status_code == 303
        page = await client.get("/demo/cron")
        assert "Manual tick ran and holds the overlap guard until" in page.text
        assert "(300 ms): watch the next tick in the audit." in page.text
        assert (await read_state(fresh_redis))["count"] == 1

        async def released() -> bool:  # the hold ends by itself, and lets the guard go
            return not HOLDING and not await fresh_redis.exists(f"{PREFIX}:running")

        await until_true(released, timeout_s=3)


async def test_the_page_teaches_its_failure_modes(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        page = (await client.get("/demo/cron")).text
        assert 'id="hold-ms"' in page and "Hold the run (ms)" in page
        assert "Try it" in page and 'href="/demo/guide/schedules"' in page
        for path in ("app/schedules/cron_counter.py", "mega/schedules/locks.py"):
            assert f'href="/demo/source?path={path}"' in page
        assert "claimed by another instance" in page and "overlap" in page


def instant_s(tick: dict[str, Any]) -> float:
    return datetime.fromisoformat(tick["instant"]).timestamp()


async def test_pause_makes_every_scheduler_skip_its_ticks_until_resume(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    """Two schedulers tick every second; a pause from the page makes both skip each tick with
    the reason "paused" (no winner, the count stands still), a manual tick still runs, and a
    resume gives the next tick a winner again. The changes are rows of the audit."""
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        ctx = client.app.state.ctx
        hosts = [
            Scheduler(ctx, instance_id=f"scheduler@test:{pid}:cd34").register(EverySecondCounter)
            for pid in (201, 202)
        ]
        for host in hosts:
            await host.start()
        try:

            async def state() -> dict[str, Any]:
                data: dict[str, Any] = (await client.get("/api/demo/cron")).json()["data"]
                return data

            headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/cron")).text)}
            assert (await state())["pause"] == {
                "paused": False,
                "at_ms": None,
                "by": None,
                "text": "Ticking.",
            }
            paused = (await client.post("/api/demo/cron/pause", headers=headers)).json()["data"]
            assert (paused["paused"], paused["by"]) == (True, DEMO_USER)
            assert abs(paused["at_ms"] - time.time() * 1000) < 2000
            assert paused["text"].startswith(f"Paused by {DEMO_USER} since ")
            assert (await state())["pause"] == paused
            since_s = paused["at_ms"] / 1000 + 1  # a tick claimed before the pause may still run

            async def skipped_ticks(count: int) -> list[dict[str, Any]] | None:
                # Both instances' words on each: on a busy machine one instance's skip of the
                # newest tick may be written a moment after the other's.
                ticks = [
                    t
                    for t in (await state())["ticks"]
                    if t["source"] == "schedule"
                    and instant_s(t) > since_s
                    and len(t["skipped"]) > 1
                ]
                return ticks if len(ticks) >= count else None

            await until_true(lambda: skipped_ticks(1), timeout_s=5)
            count = (await read_state(fresh_redis))["count"]
            reasons: list[str] = []
            for tick in await until_true(lambda: skipped_ticks(3), timeout_s=10):
                assert (tick["winner"], tick["fence"]) == (None, None)
                assert sorted(s["instance"] for s in tick["skipped"]) == [
                    "scheduler@test:201:cd34",
                    "scheduler@test:202:cd34",
                ]
                reasons += [s["reason"] for s in tick["skipped"]]
            # Each skip says the pause, but for an instance a busy machine woke over a second
            # late, which skips that tick as missed (LATE_LIMIT_S) before reading the pause.
            assert "paused" in reasons
            assert all(r == "paused" or r.startswith("missed: ") for r in reasons), reasons
            assert (await read_state(fresh_redis))["count"] == count  # nothing ran
            ran = await client.post("/api/demo/cron/run", json={}, headers=headers)
            assert ran.json()["data"] == {"ran": True}  # someone asked for this one
            assert (await read_state(fresh_redis))["count"] == count + 1

            resumed = (await client.post("/api/demo/cron/resume", headers=headers)).json()["data"]
            assert (resumed["paused"], resumed["by"]) == (False, DEMO_USER)
            assert resumed["text"].startswith(f"Ticking. Resumed by {DEMO_USER} at ")
            after_s = resumed["at_ms"] / 1000 + 1

            async def ticking() -> dict[str, Any] | None:
                return next(
                    (
                        t
                        for t in (await state())["ticks"]
                        # Both instances' words on it: the loser's skip may be written after
                        # the winner's run on a busy machine.
                        if t["source"] == "schedule"
                        and instant_s(t) > after_s
                        and t["winner"]
                        and t["skipped"]
                    ),
                    None,
                )

            tick = await until_true(ticking, timeout_s=5)
            assert [s["reason"] for s in tick["skipped"]] == ["claimed by another instance"]
            changes = [
                (t["source"], [s["reason"] for s in t["skipped"]])
                for t in (await state())["ticks"]
                if t["source"] in ("pause", "resume")
            ]
            assert changes == [
                ("resume", [f"resumed by {DEMO_USER}"]),
                ("pause", [f"paused by {DEMO_USER}"]),
            ]
            page = (await client.get("/demo/cron")).text
            assert '<span class="badge badge-warn">pause</span>' in page
            assert '<span class="badge badge-ok">resume</span>' in page
        finally:
            for host in hosts:
                await host.stop()


async def test_the_pause_form_works_without_javascript(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        await login(client)
        page = (await client.get("/demo/cron")).text
        assert '<form method="post" action="/demo/cron/pause" id="pause-form"' in page
        token = csrf_from(page)
        assert (await client.post("/demo/cron/pause")).status_code == 403  # no CSRF token
        posted = await client.post("/demo/cron/pause", data={"csrf_token": token})
        assert posted.status_code == 303 and posted.headers["location"] == "/demo/cron"
        page = (await client.get("/demo/cron")).text
        assert f"Paused by {DEMO_USER} since " in page  # the flash, and the pause line
        assert '<form method="post" action="/demo/cron/resume" id="pause-form"' in page
        assert ">Resume</button>" in page and 'id="pause-badge">paused</span>' in page
        posted = await client.post("/demo/cron/resume", data={"csrf_token": token})
        assert posted.status_code == 303
        page = (await client.get("/demo/cron")).text
        assert f"Ticking. Resumed by {DEMO_USER} at " in page
        assert ">Pause</button>" in page and 'id="pause-badge">ticking</span>' in page


async def test_a_viewer_is_refused_the_pause_and_the_run_and_an_admins_are_audited(
    tmp_path: Path, nats_url: str, redis_url: str, fresh_redis: redis.Redis
) -> None:
    async with web_client(sample_config_for(tmp_path, nats_url, redis_url)) as client:
        db = client.app.state.ctx.db
        ensure_user(db, "vera", "vera-password-1")  # not in auth.roles: a viewer
        await login(client, "vera", "vera-password-1")
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/cron")).text)}
        assert (await client.get("/api/demo/cron")).status_code == 200  # reads are hers
        for path in ("/api/demo/cron/pause", "/api/demo/cron/run"):
            refused = await client.post(path, headers=headers)
            assert refused.status_code == 403
            assert refused.json()["error"]["message"].startswith(
                "vera may not do this: it takes the operator role (which may retry, requeue, "
                "cancel, pause, resume and run now), and vera has the viewer role"
            )
        assert not (await client.get("/api/demo/cron")).json()["data"]["pause"]["paused"]
        assert await db.run(lambda session: audit.entries(session)) == []

        await client.post("/logout", headers=headers)
        await login(client)  # demo: an admin in the sample's config
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/cron")).text)}
        assert (await client.post("/api/demo/cron/pause", headers=headers)).status_code == 200
        [row] = await db.run(lambda session: audit.entries(session))
        assert (row.actor, row.action, row.target) == (
            DEMO_USER,
            "pause",
            "schedule:CronCounterSchedule",
        )
