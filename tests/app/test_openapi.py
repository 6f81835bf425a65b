"""The JSON routes' contract: FastAPI's OpenAPI description with the envelope and error models,
for logged-in users only, and a page that lists it (schemathesis fuzzes it in
tests/e2e/test_openapi.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.factories import login, sample_config_for, web_client


async def test_the_contract_is_served_to_logged_in_users_only(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = sample_config_for(tmp_path, nats_url, redis_url)
    async with web_client(config) as client:
        anonymous = await client.get("/openapi.json", headers={"Accept": "application/json"})
        assert anonymous.status_code == 401 and anonymous.json()["ok"] is False
        assert (await client.get("/docs")).status_code == 303  # to the login page
        await login(client)
        schema: dict[str, Any] = (await client.get("/openapi.json")).json()
        paths = schema["paths"]
        assert "/api/demo/jobs" in paths and "/login" not in paths and "/demo" not in paths
        post = paths["/api/demo/jobs"]["post"]
        assert sorted(post["responses"]) == ["201", "401", "403", "422", "503"]
        created = post["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
        envelope = schema["components"]["schemas"][created.rsplit("/", 1)[1]]
        assert envelope["properties"]["ok"]["const"] is True
        assert sorted(envelope["required"]) == ["data", "meta", "ok"]
        error = schema["components"]["schemas"]["ErrorEnvelope"]
        assert error["properties"]["ok"]["const"] is False
        page = await client.get("/docs")
        assert page.status_code == 200 and "/api/demo/events/signup" in page.text
