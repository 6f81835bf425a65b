"""`mega dev` on the sample's config, as `make run` starts it: embedded servers, the three hosts,
the banner with the URL and the login, and a Ctrl-C that leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mega.runtime.embedded import free_port
from tests.processes import alive, descendants

ROOT = Path(__file__).resolve().parents[2]
MEGA = [sys.executable, "-m", "mega"]


@pytest.mark.slow
def test_dev_comes_up_serves_and_leaves_nothing_behind(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mega_config.py", tmp_path / "mega_config.py")
    port = free_port()
    unset = ("NATS_URL", "REDIS_URL", "DATABASE_URL", "MEGA_DEMO_USER", "MEGA_DEMO_PASSWORD")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["NO_COLOR"] = "1"
    dev = subprocess.Popen(
        [*MEGA, "dev", "--port", str(port), "--config", str(tmp_path / "mega_config.py")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output: list[str] = []
    try:
        assert dev.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = dev.stdout.readline()
            output.append(line)
            if "log in as" in line:
                break
        text = "".join(output)
        assert f"http://localhost:{port}/demo" in text, text
        assert "log in as demo / demo" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200
        family = descendants(dev.pid)
        assert len(family) >= 5  # nats, redis, web, scheduler, worker (+ pool processes)
        dev.send_signal(signal.SIGINT)
        rest, _ = dev.communicate(timeout=60)
        assert dev.returncode == 0, text + rest
        assert "Traceback" not in text + rest
        time.sleep(0.2)
        assert [pid for pid in family if alive(pid)] == []
        assert (tmp_path / "var" / "nats" / "jetstream").is_dir()  # the file store lives in ./var
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        if dev.stdout is not None:
            dev.stdout.close()
