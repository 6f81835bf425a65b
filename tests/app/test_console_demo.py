"""/demo and GET /api/demo/console: the charts' series from real jobs on a real worker and real
ticks of a real scheduler, bounded to the 10-minute window; short ids of the scheduler and worker
instances seen."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from app.schedules.cron_counter import CronCounterSchedule
from app.services import console_series
from app.services.console_series import STEP_S, STEPS, WINDOW_S, build_series, percentile
from app.services.instances import short_instance
from mega import Scheduler
from mega.config import Config
from mega.runtime.bootstrap import boot, shutdown
from mega.web import scheduler_instances
from tests.factories import authed, csrf_from, job_worker, login, web_client

SERIES = ("jobs_per_s", "start_p50_ms", "start_p99_ms", "dlq", "tick_lateness_ms")


async def enqueue(client: httpx.AsyncClient, headers: dict[str, str], mode: str) -> None:
    response = await client.post(
        "/api/demo/jobs", json={"to": "ada@example.com", "mode": mode}, headers=headers
    )
    assert response.status_code == 201, response.text


async def series_until(
    client: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool], timeout_s: float = 20
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        series: dict[str, Any] = (await client.get("/api/demo/console")).json()["data"]["series"]
        if series["ok"] and check(series):
            return series
        assert asyncio.get_running_loop().time() < deadline, f"series never matched: {series}"
        await asyncio.sleep(0.2)


def assert_in_window(series: dict[str, Any]) -> None:
    window = series["window"]
    assert window["seconds"] == WINDOW_S and window["step_s"] == STEP_S
    assert window["end_ms"] - window["start_ms"] <= WINDOW_S * 1000
    for name in SERIES:
        times = [t for t, _ in series[name]]
        assert times == sorted(times), name
        assert all(window["start_ms"] <= t <= window["end_ms"] for t in times), name
    assert len(series["jobs_per_s"]) == STEPS


# -- the pure half ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([5.0], 50, 5.0),
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([1.0, 2.0, 3.0, 4.0], 99, 4.0),
        ([float(n) for n in range(1, 101)], 99, 99.0),
        ([9.0, 1.0, 5.0], 50, 5.0),
    ],
)
def test_percentile_is_nearest_rank(samples: list[float], q: float, expected: float) -> None:
    assert percentile(samples, q) == expected


def test_build_series_keeps_only_the_window() -> None:
    now_s = 1_700_000_005.0  # 5 s into its step
    last = int(now_s // STEP_S)
    steps = list(range(last - STEPS + 1, last + 1))
    done = [0] * STEPS
    done[0], done[-1] = 20, 10
    starts: list[list[float]] = [[] for _ in steps]
    starts[-1] = [10.0, 30.0, 20.0]
    dlq: list[int | None] = [None] * STEPS
    dlq[-2] = 3

    def tick(seconds_ago: float, source: str = "schedule") -> dict[str, Any]:
        instant = datetime.fromtimestamp(now_s - seconds_ago, UTC).isoformat()
        return {"instant": instant, "source": source, "lateness_ms": seconds_ago / 100}

    ticks = [tick(30), tick(700), tick(0.5, "manual"), tick(90)]
    series = build_series(steps, now_s, done, starts, dlq, ticks)

    assert series["jobs_per_s"][0][1] == 2.0  # 20 in a whole 10 s step
    assert series["jobs_per_s"][-1][1] == 2.0  # 10 in the 5 s the current step has run
    assert series["start_p50_ms"] == [[last * STEP_S * 1000, 20.0]]
    assert series["start_p99_ms"] == [[last * STEP_S * 1000, 30.0]]
    assert series["dlq"] == [[(last - 1) * STEP_S * 1000, 3]]
    # The manual tick and the one 700 s ago are left out; oldest first.
    assert [v for _, v in series["tick_lateness_ms"]] == [0.9, 0.3]
    assert series["totals"] == {"jobs_done": 30, "starts": 3, "ticks": 2}
    assert_in_window({**series, "ok": True})


@pytest.mark.parametrize(
    ("instance", "short"),
    [
        ("scheduler@web-7f9c:4121:a1b2c3", "a1b2c3 (pid 4121)"),
        ("worker@host.example.com:77:0f0f0f", "0f0f0f (pid 77)"),
        ("a-name-the-operator-chose-long", "r-chose-long"),
    ],
)
def test_short_instance(instance: str, short: str) -> None:
    assert short_instance(instance) == short


def test_a_scheduler_missing_from_the_two_newest_ticks_is_silent() -> None:
    a, b, c = (f"scheduler@h:{pid}:{pid:06d}" for pid in (1, 2, 3))  # c replaced a at :01:00

    def tick(instant: str, winner: str | None, *skipped: str, source: str = "schedule") -> Any:
        skips = [{"instance": name, "reason": "claimed"} for name in skipped]
        return {"instant": instant, "source": source, "winner": winner, "skipped": skips}

    ticks = [
        tick("T01:30", b),  # c's record of this tick has not landed yet
        tick("T01:15", "web@h:9:000009", source="manual"),
        tick("T01:00", c, b),
        tick("T00:30", a, b),
    ]
    found = {i["instance"]: (i["last_seen"], i["ticking"]) for i in scheduler_instances(ticks)}
    assert found == {b: ("T01:30", True), c: ("T01:00", True), a: ("T00:30", False)}
    assert scheduler_instances([]) == []


# -- on real servers ----------------------------------------------------------------------------


async def test_anonymous_is_refused(config: Config) -> None:
    async with web_client(config) as client:
        assert (await client.get("/api/demo/console")).status_code == 401


async def test_empty_series_before_any_job(config: Config) -> None:
    async with web_client(config) as client:
        await authed(client)
        series = await series_until(client, lambda s: True)
        assert_in_window(series)
        assert all(v == 0 for _, v in series["jobs_per_s"])
        assert series["start_p50_ms"] == [] and series["tick_lateness_ms"] == []
        # Sampled by each read of the console: this one and the page's just before, one point,
        # or two when the two reads fell on either side of a step's end.
        assert [v for _, v in series["dlq"]] in ([0], [0, 0])
        assert series["totals"] == {"jobs_done": 0, "starts": 0, "ticks": 0}
        workers = (await client.get("/api/demo/console")).json()["data"]["workers"]
        assert workers == {"ok": True, "instances": []}
        page = await client.get("/demo")
        assert "No jobs finished in the last 10 minutes" in page.text


async def test_jobs_done_latency_and_dlq_from_real_jobs(config: Config) -> None:
    async with web_client(config) as client, job_worker(config) as worker:
        headers = await authed(client)
        for _ in range(5):
            await enqueue(client, headers, "ok")
        series = await series_until(client, lambda s: s["totals"]["jobs_done"] == 5)
        assert series["totals"]["starts"] == 5
        # each step's rate is its jobs over at most STEP_S seconds, rounded to 0.01 per step
        assert sum(v for _, v in series["jobs_per_s"]) >= 5 / STEP_S - 0.005 * STEPS
        assert series["start_p50_ms"], "five first attempts started: a latency point"
        for (t50, p50), (t99, p99) in zip(
            series["start_p50_ms"], series["start_p99_ms"], strict=True
        ):
            assert t50 == t99 and 0 <= p50 <= p99
        assert series["dlq"][-1][1] == 0
        workers = (await client.get("/api/demo/console")).json()["data"]["workers"]
        (seen,) = workers["instances"]
        assert seen["instance"] == worker.instance_id
        assert seen["short"] == short_instance(worker.instance_id)
        page = (await client.get("/demo")).text
        assert f'title="{worker.instance_id}"' in page

        await enqueue(client, headers, "fail")  # three attempts, then the DLQ
        series = await series_until(client, lambda s: s["dlq"][-1][1] == 1)
        assert series["totals"]["jobs_done"] == 5  # a failure is not a finished job
        assert series["totals"]["starts"] == 6  # its first attempt started
        assert_in_window(series)


async def test_the_worker_samples_the_dlq_size_when_a_job_lands_there(config: Config) -> None:
    async with web_client(config) as client, job_worker(config):
        await login(client)  # and no visit to the console, which would sample the DLQ itself
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/jobs")).text)}
        await enqueue(client, headers, "fail")
        deadline = asyncio.get_running_loop().time() + 20
        while (await client.get("/api/demo/jobs")).json()["data"]["dlq"]["count"] != 1:
            assert asyncio.get_running_loop().time() < deadline, "the job never reached the DLQ"
            await asyncio.sleep(0.1)
        # Nobody has read the console: the worker's own sample is there.
        redis = client.app.state.ctx.cache("main").native
        keys = [key async for key in redis.scan_iter(f"{console_series.KEY_PREFIX}:dlq:*")]
        assert [await redis.get(key) for key in keys] == ["1"]


# The sample's schedule ticking every second: the same class name, so the same name, lock key
# and audit, which the console reads.
EverySecond = type(CronCounterSchedule.__name__, (CronCounterSchedule,), {"cron": "* * * * * *"})


async def run_scheduler(config: Config, body: Callable[[], Awaitable[None]]) -> None:
    ctx = await boot(config, role="scheduler", database=False)
    scheduler = Scheduler(ctx).register(EverySecond)
    await scheduler.start()
    try:
        await body()
    finally:
        await scheduler.stop(5)
        await shutdown(ctx)


async def test_tick_lateness_and_short_instances_from_a_real_scheduler(config: Config) -> None:
    async with web_client(config) as client:
        await authed(client)

        async def watch() -> None:
            series = await series_until(client, lambda s: len(s["tick_lateness_ms"]) >= 3)
            assert all(0 <= v < 1000 for _, v in series["tick_lateness_ms"])
            assert series["totals"]["ticks"] == len(series["tick_lateness_ms"])
            assert_in_window(series)
            schedules = (await client.get("/api/demo/console")).json()["data"]["schedules"]
            (instance,) = schedules["instances"]
            assert instance["short"] == short_instance(instance["instance"])
            assert instance["ticking"] is True
            host, pid, suffix = instance["instance"].split(":")
            assert instance["short"] == f"{suffix} (pid {pid})" and host.startswith("scheduler@")
            page = (await client.get("/demo")).text
            assert f'title="{instance["instance"]}"' in page
            assert f">{instance['short']}<" in page

        await run_scheduler(config, watch)
