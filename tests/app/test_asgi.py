"""`uvicorn app.asgi:app`: the sample served by a plain ASGI server, booted by its lifespan as
`mega start` boots it (the context, the users, the CPU pool), and stopped cleanly by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from mega.drivers.embedded import free_port
from tests.factories import DEMO_PASSWORD, DEMO_USER, authed, sample_config
from tests.processes import alive, descendants, wait_for_status

ROOT = Path(__file__).resolve().parents[2]


async def test_uvicorn_serves_the_sample_and_stops_on_sigterm(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    config = sample_config(
        tmp_path, nats_url=nats_url, redis_url=redis_url, users={DEMO_USER: DEMO_PASSWORD}
    )
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.asgi:app", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "MEGA_CONFIG": str(config)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_status(
            f"{url}/readyz", 200, 60, while_alive=server.pid, logs=log_path.read_text
        )  # every dependency up
        children = descendants(server.pid)
        assert children, "the lifespan started no CPU pool"
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            headers = await authed(client)  # the user the config asks for was made at start
            enqueued = await client.post(
                "/api/demo/jobs", json={"to": "ada@example.com"}, headers=headers
            )
            assert enqueued.status_code == 201, enqueued.text
            hashed = await client.post(
                "/api/demo/worker/hash", json={"input": "x", "rounds": 1000}, headers=headers
            )
            assert hashed.status_code == 200, hashed.text
            assert hashed.json()["data"]["mode"] == "pool"
        server.send_signal(signal.SIGTERM)
        # uvicorn re-raises the SIGTERM once it has shut down (a supervisor then sees why it
        # ended): the exit status says the signal, the log that the lifespan's shutdown ran.
        assert server.wait(30) in (0, -signal.SIGTERM), log_path.read_text()
        assert "Application shutdown complete" in log_path.read_text()
        assert not [pid for pid in children if alive(pid)], "a pool child outlived the server"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_config_that_fails_stops_the_server_with_its_message(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    server = subprocess.run(
        [sys.executable, "-m", "uvicorn", "app.asgi:app", "--port", str(free_port())],
        cwd=ROOT,
        env={**os.environ, "MEGA_CONFIG": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert server.returncode != 0
    assert f"config file not found: {missing}" in server.stderr
