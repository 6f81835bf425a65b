"""`mega new shop`, as a user does it: this checkout installed (not editable) in a fresh
virtualenv, the project written by that install's `mega`, its tests passing through its own
Makefile, `mega check`, an API token, then `mega dev` serving it: an order posted with the
token goes through the outbox, the listener and the job, and the page shows its receipt.
Ctrl-C leaves nothing running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from mega.drivers.embedded import free_port
from mega.runtime.scaffold import TEMPLATES
from tests.processes import alive, descendants, wait_for_status, wait_for_text

# The generated project's tests, as its templates declare them.
PROJECT_TESTS = sum(
    len(re.findall(r"^(?:async )?def test_", path.read_text(), re.MULTILINE))
    for path in (TEMPLATES / "tests").glob("test_*.py.tmpl")
)
ORDER = {"email": "ada@example.com", "item": "coffee beans", "quantity": 2}
# Variables of this test session that would point the project elsewhere than its own servers.
UNSET = (
    "NATS_URL",
    "REDIS_URL",
    "DATABASE_URL",
    "MEGA_CONFIG",
    "MEGA_ENV",
    "MEGA_BUS",
    "MEGA_SECRET_KEY",
    "VIRTUAL_ENV",
    "PYTHONPATH",
)


def run(command: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    """Run `command`; its output, or an assertion naming it and showing the end of it."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        timeout=timeout,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-4000:]}"
    return done.stdout


def request(url: str, token: str, body: object = None) -> tuple[int, str]:
    """GET `url` (POST `body` as JSON when given) with the API token; status and text."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as answer:
        return int(answer.status), answer.read().decode()


def poll(check: Callable[[], bool], what: str, timeout_s: float, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s\n{logs()[-4000:]}")
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_new_project_installs_passes_its_tests_and_serves_an_order_to_its_receipt(
    tmp_path: Path, checkout_copy: Path
) -> None:
    venv = tmp_path / "venv"
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", NO_COLOR="1")
    run([sys.executable, "-m", "venv", venv], tmp_path, env, timeout=120)
    # What the project's dev extra asks of mega-py, from this checkout: pip keeps it then.
    pip: list[str | Path] = [
        bin_dir / "python",
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    run([*pip, f"{checkout_copy}[web,embedded,testing]"], tmp_path, env, timeout=600)
    # The installed `mega` writes the project: its templates are in the package data.
    run([bin_dir / "mega", "new", "shop"], tmp_path, env)
    project = tmp_path / "shop"

    tested = run(["make", "test", f"PYTHON={bin_dir / 'python'}"], project, env, timeout=600)
    assert re.search(rf"\b{PROJECT_TESTS} passed\b", tested), tested[-4000:]
    checked = run([bin_dir / "mega", "check"], project, env, timeout=60)
    assert checked.splitlines()[-1].endswith(" ok"), checked
    created = run([bin_dir / "mega", "token", "create", "e2e"], project, env, timeout=60)
    shown = re.search(r"^mega_\S+$", created, re.MULTILINE)  # stdout; stderr says it is shown once
    assert shown, created
    token = shown.group()
    assert (project / "var" / "mega.db").is_file()  # the project's own SQLite, under it

    port = free_port()
    dev = subprocess.Popen(
        [str(bin_dir / "mega"), "dev", "--port", str(port), "--schedulers", "1", "--workers", "1"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(dev.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()

    def logs() -> str:
        return "".join(lines)

    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_status(f"{base}/healthz", 200, 90, while_alive=dev.pid, logs=logs)
        status, text = request(f"{base}/api/orders", token, ORDER)
        assert status == 201, text
        order_id = json.loads(text)["data"]["order_id"]

        def receipt_shown() -> bool:
            page = request(f"{base}/", token)[1]
            row = re.search(rf'id="order-{order_id}">(.*?)</tr>', page, re.DOTALL)
            return row is not None and "<td>sent</td>" in row.group(1)

        poll(receipt_shown, f"receipt of order {order_id} on the page", 60, logs)
        wait_for_text(logs, f"receipt for order {order_id} sent to", 1, 10, while_alive=dev.pid)
        family = descendants(dev.pid)
        assert len(family) >= 5  # nats, redis, web (and its pool), scheduler, worker
        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0, logs()
        reader.join(timeout=10)
        assert "Traceback" not in logs(), logs()
        poll(lambda: not any(alive(pid) for pid in family), "stop of every process", 10, logs)
        assert not (project / "var" / "dev.env").exists()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        reader.join(timeout=10)
        dev.stdout.close()  # type: ignore[union-attr]
