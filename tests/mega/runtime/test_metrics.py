"""/metrics is opt-in: off unless the config enables it (counting: tests/app/test_*metrics.py)."""

from __future__ import annotations

from pathlib import Path

from mega.config import load_config
from tests.factories import web_client, write_config


async def test_metrics_are_off_unless_enabled(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url))
    async with web_client(config) as client:
        response = await client.get("/metrics")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
