"""`make run BUS=postgres`, as a user runs it: `mega dev` with MEGA_BUS=postgres and no
DATABASE_URL starts an embedded PostgreSQL beside NATS and Redis, the app's tables and the
bus's jobs and events live there, and ok, flaky and fail jobs reach their ends; a dead letter
is requeued and comes back to the DLQ after three more attempts."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mega.drivers.embedded import free_port
from tests.processes import descendants

ROOT = Path(__file__).resolve().parents[2]


def wait_for(client: httpx.Client, job_id: str, status: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        data = client.get("/api/demo/jobs").json()["data"]
        job = next((j for j in data["jobs"] if j["id"] == job_id), None)
        if job is not None and job["state"] == status:
            return data, job
        assert time.monotonic() < deadline, f"job {job_id} never reached {status}: {job}"
        time.sleep(0.2)


@pytest.mark.slow
def test_make_run_bus_postgres_runs_jobs_to_their_ends(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mega_config.py", tmp_path / "mega_config.py")
    port = free_port()
    unset = ("NATS_URL", "REDIS_URL", "DATABASE_URL", "MEGA_DEMO_USER", "MEGA_DEMO_PASSWORD")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(NO_COLOR="1", MEGA_BUS="postgres")
    log = (tmp_path / "dev.log").open("w")
    dev = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mega",
            "dev",
            "--port",
            str(port),
            "--config",
            str(tmp_path / "mega_config.py"),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while "log in as" not in (tmp_path / "dev.log").read_text():
            assert dev.poll() is None and time.monotonic() < deadline, (
                tmp_path / "dev.log"
            ).read_text()
            time.sleep(0.2)
        dev_env = (tmp_path / "var" / "dev.env").read_text()
        assert re.search(r"^DATABASE_URL=postgresql://\S+@127\.0\.0\.1:\d+/", dev_env, re.M)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            page = client.get("/login").text
            token = re.search(r'name="csrf-token" content="([^"]+)"', page)
            assert token is not None
            form = {"username": "demo", "password": "demo", "csrf_token": token[1]}  # dev login
            assert client.post("/login", data=form).status_code == 303
            jobs_page = client.get("/demo/jobs").text
            csrf = re.search(r'name="csrf-token" content="([^"]+)"', jobs_page)
            assert csrf is not None
            headers = {"X-CSRF-Token": csrf[1]}

            def enqueue(mode: str) -> str:
                body = {"to": "ada@example.com", "mode": mode}
                answer = client.post("/api/demo/jobs", json=body, headers=headers)
                assert answer.status_code == 201, answer.text
                return str(answer.json()["data"]["id"])

            ok_id, flaky_id, fail_id = enqueue("ok"), enqueue("flaky"), enqueue("fail")
            _, ok = wait_for(client, ok_id, "done")
            assert ok["attempts"] == 1
            _, flaky = wait_for(client, flaky_id, "done")
            assert flaky["attempts"] == 2
            data, failed = wait_for(client, fail_id, "dlq")
            assert failed["attempts"] == 3 and data["dlq"]["count"] == 1
            requeue = {"id": fail_id}
            requeued_ms = time.time() * 1000
            answer = client.post("/api/demo/jobs/dlq/requeue", json=requeue, headers=headers)
            assert answer.json()["data"] == {"requeued": 1, "left_crashed": 0}
            deadline = time.monotonic() + 60
            while True:  # three more attempts, counted from 1, then the DLQ again
                record = client.get(f"/api/demo/jobs/{fail_id}").json()["data"]
                if record["state"] == "dlq" and record["finished_at"] > requeued_ms:
                    break
                assert time.monotonic() < deadline, record
                time.sleep(0.2)
            data, failed = wait_for(client, fail_id, "dlq")
            assert failed["attempts"] == 3 and data["dlq"]["count"] == 1
            # Its three runs before the requeue stay on its card, above the requeue's line.
            details = [line["detail"] for line in failed["lines"]]
            assert details[3] == "requeued from the DLQ: attempts count from 1 again", details
        dev.send_signal(signal.SIGINT)
        dev.wait(timeout=60)
        text = (tmp_path / "dev.log").read_text()
        assert dev.returncode == 0, text
        assert "Traceback" not in text
        assert (tmp_path / "var" / "postgres").is_dir()  # the cluster lives in ./var
    finally:
        if dev.poll() is None:  # a failed step: nothing of this run may outlive the test
            family = descendants(dev.pid)
            dev.kill()
            dev.wait()
            for pid in family:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        log.close()
