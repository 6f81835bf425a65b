"""/demo/worker and its JSON: the hash in the pool, inline, bad input, and the heartbeat."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import httpx
import pytest

from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from tests.factories import csrf_from, login, sample_config_for, web_client


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
def config(tmp_path: Path, nats_url: str, redis_url: str):
    return sample_config_for(tmp_path, nats_url, redis_url)


async def authed(client: httpx.AsyncClient) -> dict[str, str]:
    await login(client)
    return {"X-CSRF-Token": csrf_from((await client.get("/demo/worker")).text)}


async def test_hash_in_pool_and_inline_give_the_same_digest(config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client)
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
        assert pool.json()["data"]["rounds"] == 5000 and pool.json()["data"]["ms"] >= 0


@pytest.mark.parametrize(
    "body,field",
    [
        ({"input": "x", "rounds": 0}, "rounds"),
        ({"input": "x", "rounds": MAX_ROUNDS + 1}, "rounds"),
        ({"input": "x", "rounds": "100"}, "rounds"),
        ({"input": "x", "rounds": 1.5}, "rounds"),
        ({"input": "x" * 1001, "rounds": 10}, "input"),
        ({"input": "x", "rounds": 10, "inline": "yes"}, "inline"),
    ],
)
async def test_bad_input_is_422_with_field_errors(config, body: dict, field: str) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client)
        response = await client.post("/api/demo/worker/hash", json=body, headers=headers)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "validation_failed" and field in error["fields"]
        stats = (await client.get("/api/demo/worker")).json()["data"]
        assert stats["busy"] == 0 and stats["queued"] == 0  # nothing was dispatched


async def test_heartbeat_keeps_answering_during_a_pool_hash_and_waits_during_inline(config) -> None:
    """Pings every 100 ms while a ~1.5 s hash runs. In the pool, pings are answered while the
    hash is still running; inline, none is answered before the hash is done."""
    rounds = 4_000_000
    async with web_client(config, pools=True) as client:
        headers = await authed(client)

        async def hash_and_ping(inline: bool) -> tuple[float, list[float]]:
            answered: list[float] = []
            request = asyncio.create_task(
                client.post("/api/demo/worker/hash", json={"input": "hb", "rounds": rounds,
                            "inline": inline}, headers=headers, timeout=60)
            )  # fmt: skip

            async def pinger() -> None:
                while not request.done():
                    response = await client.get("/api/demo/ping")
                    assert response.status_code == 200
                    answered.append(time.monotonic())
                    await asyncio.sleep(0.1)

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


async def test_overloaded_pool_answers_429_with_retry_after(config) -> None:
    async with web_client(config, pools=True) as client:
        headers = await authed(client)
        pool = client.app.state.ctx.workers["hash"]  # type: ignore[attr-defined]
        capacity = pool.settings.pool_size + pool.settings.max_queue
        requests = [
            client.post("/api/demo/worker/hash", json={"input": str(n), "rounds": 300_000},
                        headers=headers, timeout=60)
            for n in range(capacity + 3)
        ]  # fmt: skip
        responses = await asyncio.gather(*requests)
        statuses = [r.status_code for r in responses]
        assert statuses.count(200) == capacity
        assert statuses.count(429) == 3
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.json()["error"]["code"] == "worker.overloaded"
        assert int(refused.headers["retry-after"]) >= 1


async def test_page_renders_and_no_js_form_posts_redirects_gets(config) -> None:
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


async def test_a_broken_pool_makes_readyz_fail_naming_it(config) -> None:
    """Kill the pool's processes past max_restarts: runs fail with worker.crashed, the route
    answers 503, and /readyz names the pool."""
    import os
    import signal

    from tests.processes import command_line, descendants

    async with web_client(config, pools=True) as client:
        headers = await authed(client)
        pool = client.app.state.ctx.workers["hash"]  # type: ignore[attr-defined]
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


async def test_inline_runs_are_capped_and_one_at_a_time(config) -> None:
    async with web_client(config, pools=True) as client:
        await login(client)
        headers = {"X-CSRF-Token": csrf_from((await client.get("/demo/worker")).text)}
        over = await client.post(
            "/api/demo/worker/hash",
            json={"input": "x", "rounds": 8_000_001, "inline": True}, headers=headers,
        )  # fmt: skip
        assert over.status_code == 422
        assert "8,000,000" in over.json()["error"]["fields"]["body"]
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
