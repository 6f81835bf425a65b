"""/demo/worker and its JSON: the hash in the pool, inline, bad input, and the heartbeat."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.workers.hash_rates import HashRates, Mode
from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from app.workers.pool_log import PoolLog
from app.workers.run_progress import RunProgress
from mega.config import Config
from tests.factories import authed, csrf_from, login, sample_config_for, web_client

ROUNDS = "must be a whole number from 1 to 50000000"
TIMEOUT = "must be a whole number of milliseconds from 1 to 60000"
INLINE_CAP = (
    "must be a whole number from 1 to 8000000 for an inline run, which stalls every user "
    "(the pool takes up to 50000000)"
)


def chain(text: str, rounds: int) -> str:
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).hexdigest().encode()
    return digest.decode()


@pytest.mark.parametrize("text,rounds", [("", 1), ("mega", 1), ("mega", 1000), ("héllo", 7)])
def test_digest_equals_hashlib_chain(text: str, rounds: int) -> None:
    assert sha256_loop({"input": text, "rounds": rounds}) == {
        "digest": chain(text, rounds),
        "rounds": rounds,
    }


def test_default_rounds_is_one_million() -> None:
    assert sha256_loop({"input": "a"})["rounds"] == 1_000_000


@pytest.mark.parametrize("rounds", [0, -1, MAX_ROUNDS + 1, "10", 1.5, True])
def test_task_rejects_bad_rounds(rounds: object) -> None:
    with pytest.raises(ValueError, match="rounds"):
        sha256_loop({"input": "a", "rounds": rounds})


@pytest.fixture
def config(tmp_path: Path, nats_url: str, redis_url: str) -> Config:
    return sample_config_for(tmp_path, nats_url, redis_url)


async def test_hash_in_pool_and_inline_give_the_same_digest(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        body = {"input": "mega", "rounds": 5000}
        pool = await client.post("/api/demo/worker/hash", json=body, headers=headers)
        inline = await client.post(
            "/api/demo/worker/hash", json={**body, "inline": True}, headers=headers
        )
        assert pool.status_code == inline.status_code == 200
        assert (
            pool.json()["data"]["digest"] == inline.json()["data"]["digest"] == chain("mega", 5000)
        )
        assert (pool.json()["data"]["mode"], inline.json()["data"]["mode"]) == ("pool", "inline")
        assert pool.json()["data"]["rounds"] == 5000 and 0 <= pool.json()["data"]["ms"] < 30_000


@pytest.mark.parametrize(
    "body,field,message",
    [
        ({"input": "x", "rounds": 0}, "rounds", ROUNDS),
        ({"input": "x", "rounds": MAX_ROUNDS + 1}, "rounds", ROUNDS),
        ({"input": "x", "rounds": "100"}, "rounds", ROUNDS),
        ({"input": "x", "rounds": 1.5}, "rounds", ROUNDS),
        ({"input": "x", "rounds": 8_000_001, "inline": True}, "rounds", INLINE_CAP),
        ({"input": "x", "rounds": 10, "timeout_ms": "soon"}, "timeout_ms", TIMEOUT),
        ({"input": "x" * 1001, "rounds": 10}, "input", "must be at most 1000 characters"),
        ({"input": "x", "rounds": 10, "inline": "yes"}, "inline", "must be true or false"),
    ],
)
async def test_bad_input_is_422_with_field_errors(
    config: Config, body: dict[str, Any], field: str, message: str
) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        response = await client.post("/api/demo/worker/hash", json=body, headers=headers)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "validation_failed" and error["fields"] == {field: message}
        stats = (await client.get("/api/demo/worker")).json()["data"]
        assert stats["busy"] == 0 and stats["queued"] == 0  # nothing was dispatched


async def test_heartbeat_keeps_answering_during_a_pool_hash_and_waits_during_inline(
    config: Config,
) -> None:
    """Pings every 20 ms while a hash runs. In the pool (a million rounds, under half a second
    here), pings are answered while the hash is still running; inline (four million, about
    1.5 s), none is answered before the hash is done. The pool's run is the shorter: its child
    is niced, and beside busy processes it gets a few hundredths of a core (four million rounds
    outran the route's 60 s there)."""
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")

        async def hash_and_ping(inline: bool) -> tuple[float, list[float]]:
            answered: list[float] = []
            rounds = 4_000_000 if inline else 1_000_000
            request = asyncio.create_task(
                client.post(
                    "/api/demo/worker/hash",
                    json={"input": "hb", "rounds": rounds, "inline": inline},
                    headers=headers,
                    timeout=60,
                )
            )

            async def pinger() -> None:
                while not request.done():
                    response = await client.get("/api/demo/ping")
                    assert response.status_code == 200
                    answered.append(time.monotonic())
                    await asyncio.sleep(0.02)

            ping_task = asyncio.create_task(pinger())
            response = await request
            finished = time.monotonic()
            assert response.status_code == 200
            await ping_task
            return finished, answered

        finished, answered = await hash_and_ping(inline=False)
        during_pool = [t for t in answered if t < finished]
        assert len(during_pool) >= 5, "pings should be answered while the pool hashes"

        finished, answered = await hash_and_ping(inline=True)
        during_inline = [t for t in answered if t < finished]
        assert len(during_inline) <= 1, "inline blocks the loop: no ping answered during it"
        assert len(during_pool) > len(during_inline)


async def test_overloaded_pool_answers_429_with_retry_after(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        pool = client.app.state.ctx.workers["hash"]
        capacity = pool.settings.pool_size + pool.settings.max_queue
        requests = [
            client.post(
                "/api/demo/worker/hash",
                json={"input": str(n), "rounds": 300_000},
                headers=headers,
                timeout=60,
            )
            for n in range(capacity + 3)
        ]
        responses = await asyncio.gather(*requests)
        statuses = [r.status_code for r in responses]
        assert statuses.count(200) == capacity
        assert statuses.count(429) == 3
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.json()["error"]["code"] == "worker.overloaded"
        assert int(refused.headers["retry-after"]) >= 1


async def test_page_renders_and_no_js_form_posts_redirects_gets(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        await login(client)
        page = await client.get("/demo/worker")
        assert page.status_code == 200 and "Heartbeat" in page.text
        token = csrf_from(page.text)
        posted = await client.post(
            "/demo/worker/hash",
            data={"csrf_token": token, "input": "mega", "rounds": "100", "mode": "pool"},
        )
        assert posted.status_code == 303
        result = await client.get(posted.headers["location"])
        assert chain("mega", 100) in result.text


async def test_a_broken_pool_makes_readyz_fail_naming_it(config: Config) -> None:
    """Kill the pool's processes past max_restarts: runs fail with worker.crashed, the route
    answers 503, and /readyz names the pool."""
    import os
    import signal

    from tests.processes import command_line, descendants

    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        pool = client.app.state.ctx.workers["hash"]
        for _ in range(pool.settings.max_restarts + 1):
            children = [
                pid for pid in descendants(os.getpid()) if "workers/child.py" in command_line(pid)
            ]
            if not children:
                break
            restarts = pool.stats()["restarts"]
            os.kill(children[0], signal.SIGKILL)
            for _ in range(100):
                stats = pool.stats()
                if stats["broken"] or stats["restarts"] > restarts:
                    break
                await asyncio.sleep(0.05)
        assert pool.stats()["broken"] is True
        response = await client.post(
            "/api/demo/worker/hash", json={"input": "x", "rounds": 10}, headers=headers
        )
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "worker.crashed"
        assert "broken" in response.json()["error"]["message"]
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert "worker:hash" in ready.json()["error"]["message"]


async def test_inline_runs_are_capped_and_one_at_a_time(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        await login(client)
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/worker")).text)}
        over = await client.post(
            "/api/demo/worker/hash",
            json={"input": "x", "rounds": 8_000_001, "inline": True},
            headers=headers,
        )
        assert over.status_code == 422
        assert over.json()["error"]["fields"] == {"rounds": INLINE_CAP}  # at its field
        # The pool still takes it: the cap is for the event loop only.
        body = {"input": "x", "rounds": 1_500_000, "inline": True}
        first = await client.post("/api/demo/worker/hash", json=body, headers=headers)
        assert first.status_code == 200
        # A request that waited behind the stall is refused, not run inline again.
        second = await client.post("/api/demo/worker/hash", json=body, headers=headers)
        assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
        assert second.json()["error"]["code"] == "rate_limited"
        pool = await client.post(
            "/api/demo/worker/hash", json={**body, "inline": False}, headers=headers
        )
        assert pool.status_code == 200  # the pool is never gated


# -- progress, timeout, kill and burst (the failure modes the page provokes) --------------------


def test_run_progress_keeps_the_latest_figure_until_the_run_ends() -> None:
    now = [0.0]
    board = RunProgress(max_runs=2, ttl_s=60, clock=lambda: now[0])
    assert board.get("a") is None
    board.start("a")
    assert board.get("a") == {"fraction": 0.0, "note": None}
    board.update("a", 0.5, "half")
    board.update("gone", 0.9, "ignored")  # not listed: not added
    assert board.get("a") == {"fraction": 0.5, "note": "half"} and len(board) == 1
    board.end("a")
    assert board.get("a") is None and len(board) == 0


def test_run_progress_is_bounded_and_forgets_old_runs() -> None:
    now = [0.0]
    board = RunProgress(max_runs=2, ttl_s=60, clock=lambda: now[0])
    for run_id in ("a", "b", "c"):
        board.start(run_id)
    assert (board.get("a"), len(board)) == (None, 2)  # the oldest went first
    now[0] = 59.0
    assert board.get("b") is not None
    now[0] = 60.0
    assert board.get("b") is None and board.get("c") is None and len(board) == 0


async def wait_for(condition: Callable[[], Awaitable[bool]], timeout_s: float = 20) -> None:
    """Poll an async condition the test caused; the limit only stops a broken test hanging."""
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.02)


async def pool_state(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/demo/worker")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()["data"]
    return data


@pytest.mark.parametrize(
    "body,field",
    [
        ({"timeout_ms": 0}, "timeout_ms"),
        ({"timeout_ms": 60_001}, "timeout_ms"),
        ({"timeout_ms": "500"}, "timeout_ms"),
        ({"run_id": "has space"}, "run_id"),
        ({"run_id": "x" * 65}, "run_id"),
        ({"run_id": ""}, "run_id"),
        ({"inline": True, "timeout_ms": 500}, "timeout_ms"),
    ],
)
async def test_bad_timeout_or_run_id_is_422(
    config: Config, body: dict[str, Any], field: str
) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        response = await client.post(
            "/api/demo/worker/hash", json={"input": "x", "rounds": 10, **body}, headers=headers
        )
        assert response.status_code == 422
        assert field in response.json()["error"]["fields"]
        bad = await client.get("/api/demo/worker/progress", params={"run_id": "no/slash"})
        assert bad.status_code == 422 and "run_id" in bad.json()["error"]["fields"]


async def test_a_pool_run_reports_its_rounds_while_it_runs(config: Config) -> None:
    # Under half a second here (some 15 progress reports), and within the route's 60 s on a
    # machine so busy that the pool's niced children get 2% of a core (two busy loops beside
    # the four xdist workers of `make test`).
    rounds = 1_000_000
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        body = {"input": "p", "rounds": rounds, "run_id": "run-1"}
        running = asyncio.create_task(
            client.post("/api/demo/worker/hash", json=body, headers=headers, timeout=90)
        )
        seen: list[dict[str, Any]] = []
        while not running.done():
            figure = (await client.get("/api/demo/worker/progress?run_id=run-1")).json()["data"]
            if figure is not None:
                seen.append(figure)
            await asyncio.sleep(0.05)
        response = await running
        assert response.status_code == 200 and response.json()["data"]["rounds"] == rounds
        fractions = [figure["fraction"] for figure in seen]
        assert fractions == sorted(fractions) and any(0 < f < 1 for f in fractions), seen
        partial = next(figure for figure in seen if 0 < figure["fraction"] < 1)
        assert partial["note"].endswith(f"of {rounds:,} rounds")
        # The run ended: its entry is gone (the page then shows the result, not the bar).
        assert (await client.get("/api/demo/worker/progress?run_id=run-1")).json()["data"] is None


async def test_a_run_past_its_timeout_is_504_and_its_process_replaced(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        before = await pool_state(client)
        response = await client.post(
            "/api/demo/worker/hash",
            json={"input": "t", "rounds": 40_000_000, "timeout_ms": 200, "run_id": "slow"},
            headers=headers,
            timeout=60,
        )
        assert response.status_code == 504
        error = response.json()["error"]
        assert error["code"] == "worker.task_timeout" and "200 ms timeout" in error["message"]

        async def replaced() -> bool:
            state = await pool_state(client)
            return bool(state["size"] == 2 and state["busy"] == 0)

        await wait_for(replaced)
        assert (await pool_state(client))["restarts"] == before["restarts"]  # on purpose: free
        assert (await client.get("/api/demo/worker/progress?run_id=slow")).json()["data"] is None
        ok = await client.post(
            "/api/demo/worker/hash", json={"input": "t", "rounds": 10}, headers=headers
        )
        assert ok.status_code == 200


async def test_kill_takes_the_busy_child_the_pool_replaces_it_and_counts_a_restart(
    config: Config,
) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        state = await pool_state(client)
        assert (state["size"], state["restarts"], state["max_restarts"]) == (2, 0, 10)
        assert (state["pool_size"], state["max_queue"], state["mode"]) == (2, 8, "process")
        running = asyncio.create_task(
            client.post(
                "/api/demo/worker/hash",
                json={"input": "k", "rounds": 40_000_000},
                headers=headers,
                timeout=60,
            )
        )

        async def busy() -> bool:
            return bool((await pool_state(client))["busy"] == 1)

        await wait_for(busy)
        killed = await client.post("/api/demo/worker/kill", headers=headers)
        assert killed.status_code == 200 and isinstance(killed.json()["data"]["killed_pid"], int)
        crashed = await running
        assert crashed.status_code == 503
        assert crashed.json()["error"]["code"] == "worker.crashed"
        assert str(killed.json()["data"]["killed_pid"]) in crashed.json()["error"]["message"]

        async def replaced() -> bool:
            state = await pool_state(client)
            return bool(state["size"] == 2 and state["restarts"] == 1)

        await wait_for(replaced)
        assert (await client.post("/api/demo/worker/kill")).status_code == 403  # CSRF as ever


async def test_kill_is_refused_once_every_restart_is_spent(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        max_restarts = (await pool_state(client))["max_restarts"]
        for spent in range(1, max_restarts + 1):
            assert (await client.post("/api/demo/worker/kill", headers=headers)).status_code == 200

            async def replaced(spent: int = spent) -> bool:
                state = await pool_state(client)
                return bool(state["restarts"] == spent and state["size"] == 2)

            await wait_for(replaced)
        refused = await client.post("/api/demo/worker/kill", headers=headers)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "worker.no_restarts_left"
        state = await pool_state(client)
        assert (state["size"], state["broken"]) == (2, False)
        ok = await client.post(
            "/api/demo/worker/hash", json={"input": "k", "rounds": 10}, headers=headers
        )
        assert ok.status_code == 200


@pytest.mark.timeout(240)  # the drain's bound below, and the burst before it
async def test_a_burst_overflows_the_queue_and_a_run_sent_meanwhile_is_429(config: Config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        state = await pool_state(client)
        capacity = state["pool_size"] + state["max_queue"]
        burst = await client.post("/api/demo/worker/burst", headers=headers)
        assert burst.status_code == 200
        data = burst.json()["data"]
        assert (data["sent"], data["capacity"]) == (capacity + 4, capacity)
        assert (data["accepted"], data["refused"], data["failed"]) == (capacity, 4, [])
        assert data["retry_after_s"] >= 1
        refused = await client.post(
            "/api/demo/worker/hash", json={"input": "late", "rounds": 10}, headers=headers
        )
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "worker.overloaded"
        assert int(refused.headers["retry-after"]) >= 1

        async def drained() -> bool:
            state = await pool_state(client)
            return bool(state["busy"] == 0 and state["queued"] == 0)

        # A hang's bound: beside two busy processes the niced children hash many times slower,
        # and the burst's runs have taken over a minute to drain.
        await wait_for(drained, timeout_s=180)


async def test_without_javascript_kill_burst_and_a_timeout_answer_with_a_flash(
    config: Config,
) -> None:
    async with web_client(config, pools=True) as client:
        await login(client)
        token = csrf_from((await client.get("/demo/worker")).text)
        killed = await client.post("/demo/worker/kill", data={"csrf_token": token})
        assert killed.status_code == 303
        assert "Killed pool child" in (await client.get("/demo/worker")).text
        timed_out = await client.post(
            "/demo/worker/hash",
            data={
                "csrf_token": token,
                "input": "t",
                "rounds": "40000000",
                "timeout_ms": "200",
                "mode": "pool",
            },
        )
        assert timed_out.status_code == 303
        assert "worker.task_timeout" in (await client.get("/demo/worker")).text
        bad = await client.post(
            "/demo/worker/hash",
            data={"csrf_token": token, "input": "t", "rounds": "10", "timeout_ms": "0"},
        )
        assert bad.status_code == 422  # the page again, the sentence at its field
        assert f'<span class="field-error" id="error-timeout_ms">{TIMEOUT}</span>' in bad.text
        burst = await client.post("/demo/worker/burst", data={"csrf_token": token})
        assert burst.status_code == 303
        assert "refused with worker.overloaded" in (await client.get("/demo/worker")).text


# -- the rate measured on this machine, and the pool log ----------------------------------------


def test_hash_rates_are_the_last_runs_rounds_over_their_time_each_mode_apart() -> None:
    rates = HashRates(last_runs=2, min_rounds=1000)
    assert rates.rate("pool") is None and rates.rate("inline") is None
    rates.record("pool", 999, 0.001)  # too short to measure anything but overhead: ignored
    assert rates.rate("pool") is None
    rates.record("pool", 1_000_000, 1.0)
    rates.record("pool", 3_000_000, 0.5)
    assert rates.rate("pool") == {"rounds_per_s": 2_666_667, "runs": 2}
    rates.record("pool", 2_000_000, 1.0)  # the oldest run goes
    assert rates.rate("pool") == {"rounds_per_s": 3_333_333, "runs": 2}
    assert rates.rate("inline") is None
    rates.record("inline", 2_000_000, 2.0)
    assert rates.rate("inline") == {"rounds_per_s": 1_000_000, "runs": 1}


@pytest.mark.parametrize(
    "runs,text",
    [
        (
            [],
            "How fast is this machine? Run it once to measure: this line then gives the rounds a "
            "second of the last runs, pool and inline apart.",
        ),
        (
            [("pool", 3_000_000, 1.0)],
            "Measured on this machine: 3,000,000 rounds a second in the "
            "pool (last 1 run); so 6,000,000 rounds take about 2.0 s. Inline: run it once on the "
            "event loop to compare.",
        ),
        (
            [("inline", 1_234_567, 1.0)],
            "Measured on this machine: 1,230,000 rounds a second "
            "inline (last 1 run); so 6,000,000 rounds take about 4.9 s. The pool's rate: run it "
            "there once to measure.",
        ),
        (
            [("pool", 2_000_000, 1.0), ("pool", 2_000_000, 0.5), ("inline", 1_000_000, 0.5)],
            "Measured on this machine: 2,670,000 rounds a second in the pool (last 2 runs), "
            "2,000,000 rounds a second inline (last 1 run); so 6,000,000 rounds take about 2.2 s "
            "in the pool.",
        ),
    ],
)
def test_the_rate_sentence_says_what_was_measured_and_nothing_else(
    runs: list[tuple[Mode, int, float]], text: str
) -> None:
    rates = HashRates()
    for mode, rounds, seconds in runs:
        rates.record(mode, rounds, seconds)
    assert rates.text(6_000_000) == text


def test_the_pages_rounds_take_about_2_s_here_within_the_inline_cap() -> None:
    """The default an inline run stalls the server for: about 2 s as measured (inline first:
    that is the stall), never a figure from a faster machine (6,000,000 rounds once stalled a
    slower one 34 s)."""
    probes: list[dict[str, Any]] = []

    def probe(task: dict[str, Any]) -> None:
        probes.append(task)
        time.sleep(0.05)  # the probe's 100,000 rounds take 50 ms or more: 2,000,000 a second

    rates = HashRates()
    first = rates.page_rounds(probe, most=8_000_000)
    assert 100_000 <= first <= 4_000_000 and first % 100_000 == 0  # 2 s at that rate at most
    assert rates.page_rounds(probe, most=8_000_000) == first and len(probes) == 1  # once
    assert rates.text(1_000_000).startswith("How fast is this machine?")  # the probe is no run
    rates.record("pool", 3_000_000, 1.0)
    assert rates.page_rounds(probe, most=8_000_000) == 6_000_000
    rates.record("inline", 1_000_000, 4.0)  # 250,000 a second on the event loop
    assert rates.page_rounds(probe, most=8_000_000) == 500_000
    rates.record("inline", 100_000_000, 1.0)
    assert rates.page_rounds(probe, most=8_000_000) == 8_000_000  # the cap holds
    slow = HashRates()
    slow.record("inline", 100_000, 10.0)
    assert slow.page_rounds(probe, most=8_000_000) == 100_000  # never below the least
    assert len(probes) == 1


async def test_the_rate_is_measured_from_the_last_runs_and_said_honestly_before_any(
    config: Config,
) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        state = await pool_state(client)
        assert (state["pool_rate"], state["inline_rate"]) == (None, None)
        assert state["rate_text"].startswith("How fast is this machine? Run it once to measure")
        assert "Run it once to measure" in (await client.get("/demo/worker")).text
        assert "3 million" not in (await client.get("/demo/worker")).text

        body = {"input": "r", "rounds": 1_000_000}
        ran = (await client.post("/api/demo/worker/hash", json=body, headers=headers)).json()
        state = await pool_state(client)
        assert state["pool_rate"]["runs"] == 1 and state["inline_rate"] is None
        expected = 1_000_000 / (ran["data"]["ms"] / 1000)  # the result card's own time
        assert abs(state["pool_rate"]["rounds_per_s"] - expected) < expected * 0.01
        shown = f"{round(state['pool_rate']['rounds_per_s'], -4):,} rounds a second in the pool"
        assert state["rate_text"].startswith(f"Measured on this machine: {shown} (last 1 run)")
        assert "Inline: run it once" in state["rate_text"]

        inline = {**body, "inline": True}
        assert (await client.post("/api/demo/worker/hash", json=inline, headers=headers)).is_success
        state = await pool_state(client)
        assert state["inline_rate"]["runs"] == 1 and state["pool_rate"]["runs"] == 1
        rounds = round(state["inline_rate"]["rounds_per_s"] * 2, -5)  # 2 s of it inline
        assert f" inline (last 1 run); so {rounds:,} rounds take about " in state["rate_text"]
        assert state["rate_text"].endswith(" s in the pool.")
        assert state["rate_text"] in (await client.get("/demo/worker")).text


def test_pool_log_keeps_the_newest_lines_first_and_says_what_happened() -> None:
    log = PoolLog(max_lines=2, clock=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert log.lines() == []
    for pid, reason in ((11, "crashed"), (12, "timeout"), (13, "killed")):
        log.record({"pid": pid, "new_pid": pid + 1, "reason": reason, "ms": 320.4})
    assert [line["text"] for line in log.lines()] == [
        "child 13 killed, replaced by 14 in 0.3 s",
        "child 12 killed past its timeout, replaced by 13 in 0.3 s",
    ]
    assert log.lines()[0] == {
        "at": "03:04:05",
        "text": "child 13 killed, replaced by 14 in 0.3 s",
        "pid": 13,
        "new_pid": 14,
        "reason": "killed",
        "ms": 320.4,
    }


async def test_a_killed_child_is_a_pool_log_line_naming_it_and_its_replacement(
    config: Config,
) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client, "/demo/worker")
        assert (await pool_state(client))["log"] == []
        killed = (await client.post("/api/demo/worker/kill", headers=headers)).json()["data"]
        pid = killed["killed_pid"]

        async def logged() -> bool:
            return len((await pool_state(client))["log"]) == 1

        await wait_for(logged)
        line = (await pool_state(client))["log"][0]
        assert (line["pid"], line["reason"]) == (pid, "killed")
        assert isinstance(line["new_pid"], int) and line["new_pid"] != pid
        assert re.fullmatch(
            rf"child {pid} killed, replaced by {line['new_pid']} in \d+\.\d s", line["text"]
        ), line
        assert re.fullmatch(r"\d\d:\d\d:\d\d", line["at"])
        assert line["text"] in (await client.get("/demo/worker")).text  # without JavaScript too
