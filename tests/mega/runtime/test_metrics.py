"""/metrics is opt-in, and protectable on the web port by a token (counting:
tests/app/test_*metrics.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mega.config import load_config
from mega.errors import ConfigError
from tests.factories import web_client, write_config


async def test_metrics_are_off_unless_enabled(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url))
    async with web_client(config) as client:
        response = await client.get("/metrics")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


async def test_a_metrics_token_guards_the_web_endpoint(
    tmp_path: Path, nats_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = 'metrics = {"enabled": True}\n'
    monkeypatch.setenv("MEGA_METRICS_TOKEN", "s3cret-scrape-token")
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    assert config.metrics.token == "s3cret-scrape-token"
    async with web_client(config) as client:
        refused = await client.get("/metrics")
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith(
            "Bearer"
        )
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        scraped = await client.get(
            "/metrics", headers={"Authorization": "Bearer s3cret-scrape-token"}
        )
        assert scraped.status_code == 200 and "python_info" in scraped.text


async def test_metrics_can_stay_off_the_web_port(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    body = 'metrics = {"enabled": True, "web": False}\n'
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))
    async with web_client(config) as client:
        assert (await client.get("/metrics")).status_code == 404


async def test_a_short_metrics_token_is_a_config_error(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    body = 'metrics = {"enabled": True, "token": "short"}\n'
    with pytest.raises(ConfigError, match="token"):
        load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, body=body))


def test_a_metrics_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    """A host whose metrics port is taken stops with a sentence, not an OSError."""
    import socket

    from mega.errors import MegaError
    from mega.runtime.hosts import start_metrics_server

    body = 'metrics = {"enabled": True, "bind": "127.0.0.1"}'
    config = load_config(write_config(tmp_path, nats_url="nats://x:1", redis_url=None, body=body))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MegaError) as refused:
            start_metrics_server(config, port)
    assert refused.value.code == "metrics.port_in_use"
    assert refused.value.message.startswith(f"cannot serve metrics on 127.0.0.1:{port} (")
