"""The SQL path on PostgreSQL: users, sessions and login limiting on a real server.

On the test session's embedded PostgreSQL (tests/conftest.py), in a fresh database it creates
and drops.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.factories import DEMO_USER, csrf_from, login, web_client, write_config

pytestmark = pytest.mark.postgres


async def test_login_logout_and_limiting_on_postgres(
    tmp_path: Path,
    nats_url: str,
    redis_url: str,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mega.config import load_config

    monkeypatch.setenv("DATABASE_URL", postgres_url)
    config = load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url))
    assert config.database_url == postgres_url
    async with web_client(config) as client:
        assert client.app.state.ctx.db.url.startswith("postgresql+psycopg://")
        assert (await login(client, DEMO_USER, "wrong")).status_code == 401
        assert (await login(client)).status_code == 303
        page = await client.get("/home")
        assert page.status_code == 200
        ready = (await client.get("/readyz")).json()
        assert ready["data"]["checks"]["db"] == "ok"
        logout = await client.post("/logout", data={"csrf_token": csrf_from(page.text)})
        assert logout.status_code == 303
        assert (await client.get("/api/things")).status_code == 401
    assert not (tmp_path / "test.db").exists()  # users and sessions lived in PostgreSQL
