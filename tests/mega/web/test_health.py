"""/healthz and /readyz against real servers that the test stops and restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx

from mega.drivers.embedded import EmbeddedServer
from tests.factories import config_for, web_client


async def wait_for_status(client: httpx.AsyncClient, path: str, status: int) -> httpx.Response:
    """Poll until `path` answers `status` (dependencies take a moment to notice an outage)."""
    response = await client.get(path)
    for _ in range(100):
        if response.status_code == status:
            break
        await asyncio.sleep(0.1)
        response = await client.get(path)
    return response


async def test_healthz_answers_without_login(tmp_path: Path, nats_url: str, redis_url: str) -> None:
    async with web_client(config_for(tmp_path, nats_url, redis_url)) as client:
        response = await client.get("/healthz")
        assert response.status_code == 200
        assert response.json() == {
            "ok": True,
            "data": {"status": "alive"},
            "meta": response.json()["meta"],
        }


async def test_readyz_names_the_dependency_that_is_down_and_recovers(
    tmp_path: Path,
    nats_factory: Callable[[], EmbeddedServer],
    redis_factory: Callable[[], EmbeddedServer],
) -> None:
    nats, redis = nats_factory(), redis_factory()
    async with web_client(config_for(tmp_path, nats.url, redis.url)) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["data"]["checks"] == {"redis:main": "ok", "nats:jobs": "ok", "db": "ok"}

        redis.stop()
        down = await wait_for_status(client, "/readyz", 503)
        assert down.status_code == 503
        body = down.json()
        assert body["ok"] is False and body["error"]["code"] == "dependency.unavailable"
        assert "redis:main" in body["error"]["message"]
        assert body["meta"]["checks"]["nats:jobs"] == "ok"
        redis.start()
        assert (await wait_for_status(client, "/readyz", 200)).status_code == 200

        nats.stop()
        down = await wait_for_status(client, "/readyz", 503)
        assert "nats:jobs" in down.json()["error"]["message"]
        assert down.json()["meta"]["checks"]["redis:main"] == "ok"
        nats.start()
        assert (await wait_for_status(client, "/readyz", 200)).status_code == 200
