"""API tokens: a script posts JSON with `Authorization: Bearer` and no CSRF token; cookie
sessions still need theirs; tokens are stored hashed, listed without the secret, and revoked
from the command line; a public router needs neither login nor token."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from mega.config import load_config
from tests.factories import login, web_client, write_config

ROOT = Path(__file__).resolve().parents[3]


def mega_token(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mega", "token", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_service_posts_with_a_token_and_no_csrf_while_cookies_still_need_theirs(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    path = write_config(tmp_path, nats_url=nats_url, redis_url=redis_url)
    created = mega_token(path, "create", "deploy-bot")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("mega_") and "shown this once" in created.stderr
    async with web_client(load_config(path)) as client:
        answer = await client.post("/api/things", json={"name": "a"}, headers=bearer(token))
        assert (answer.status_code, answer.json()["data"]) == (201, {"name": "a"})
        assert not client.cookies  # nothing of a browser's was needed
        listed = await client.get("/api/things", headers=bearer(token))
        assert listed.json()["data"] == {"things": ["a"]}

        wrong = await client.post("/api/things", json={"name": "b"}, headers=bearer(token + "x"))
        assert wrong.status_code == 401 and "API token" in wrong.json()["error"]["message"]
        anonymous = await client.post("/api/things", json={"name": "b"})
        assert anonymous.status_code == 401

        await login(client)  # a cookie session: CSRF exactly as before
        no_csrf = await client.post("/api/things", json={"name": "b"})
        assert no_csrf.status_code == 403
        assert client.app.state.things == ["a"]

        # The public router: no login, no token, no CSRF token.
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=client.app),
            base_url="http://testserver",
        ) as stranger:
            pong = await stranger.post("/api/hooks/billing", json={"name": "x"})
            assert (pong.status_code, pong.json()["data"]) == (
                200,
                {"from": "billing", "pong": "x"},
            )
            refused = await stranger.post("/api/things", json={"name": "c"})
            assert refused.status_code == 401

    assert token.encode() not in (tmp_path / "test.db").read_bytes()  # only its SHA-256
    listing = mega_token(path, "list")
    assert listing.returncode == 0 and listing.stdout.startswith("deploy-bot\tcreated ")
    assert token not in listing.stdout and "last used 20" in listing.stdout

    again = mega_token(path, "create", "deploy-bot")
    assert again.returncode == 1 and "exists: revoke it first" in again.stderr
    assert mega_token(path, "revoke", "deploy-bot").stdout.strip() == "token 'deploy-bot' revoked"
    async with web_client(load_config(path)) as client:
        revoked = await client.post("/api/things", json={"name": "d"}, headers=bearer(token))
        assert revoked.status_code == 401
    gone = mega_token(path, "revoke", "deploy-bot")
    assert gone.returncode == 1 and "no token named 'deploy-bot'" in gone.stderr
    bad = mega_token(path, "create", "no spaces")
    assert bad.returncode == 1 and "1 to 64 letters" in bad.stderr


def test_a_token_is_made_with_an_end_and_scopes_which_the_list_shows(tmp_path: Path) -> None:
    path = write_config(tmp_path, nats_url="nats://127.0.0.1:1", redis_url=None)
    made = mega_token(path, "create", "ci", "--expires", "90d", "--scope", "jobs:enqueue")
    assert made.returncode == 0, made.stderr
    assert "token 'ci' created (expires in 90d; scopes jobs:enqueue)" in made.stderr
    default = mega_token(path, "create", "app")
    assert "expires in 90d; scopes jobs:enqueue,console:read" in default.stderr
    forever = mega_token(
        path, "create", "ops", "--expires", "never", "--scope", "console:read,console:operate"
    )
    assert "(never expires; scopes console:read,console:operate)" in forever.stderr
    rows = {line.split("\t")[0]: line for line in mega_token(path, "list").stdout.splitlines()}
    in_90_days = (datetime.now(UTC) + timedelta(days=90)).date().isoformat()
    assert f"\texpires {in_90_days}T" in rows["ci"] and rows["ci"].endswith("\tscopes jobs:enqueue")
    assert "\tnever expires\tscopes console:read,console:operate" in rows["ops"]
    for args, said in (
        (("--scope", "jobs:everything"), "unknown scope(s) jobs:everything: give one or more of"),
        (("--expires", "soon"), "--expires 'soon': give a whole number and a unit"),
        (("--expires", "0d"), "--expires '0d'"),
    ):
        refused = mega_token(path, "create", "bad", *args)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert "bad\t" not in mega_token(path, "list").stdout  # nothing was made
