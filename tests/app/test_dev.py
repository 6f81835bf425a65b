"""`mega dev` on the sample's config, as `make run` starts it: embedded servers, the web app with
two schedulers and two workers, the banner with the URL and the login, a worker that dies
started again, and a Ctrl-C that leaves nothing behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mega.drivers.embedded import free_port
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
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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

        def read_until(pattern: str) -> re.Match[str]:
            """The first line so far, or from now on, that matches `pattern`."""
            deadline = time.monotonic() + 60
            seen = 0
            while time.monotonic() < deadline:
                for line in output[seen:]:
                    found = re.search(pattern, line)
                    if found:
                        output.remove(line)  # each line answers one wait
                        return found
                seen = len(output)
                output.append(dev.stdout.readline())  # type: ignore[union-attr]
            raise AssertionError(f"no line matches {pattern!r}:\n{''.join(output)}")

        # The servers' URLs for hosts started by hand beside it (removed when it stops).
        dev_env = (tmp_path / "var" / "dev.env").read_text()
        assert dev_env.startswith("NATS_URL=nats://127.0.0.1:") and "REDIS_URL=redis://" in dev_env
        for name in ("scheduler-1", "scheduler-2", "worker-2"):
            read_until(rf"^{name} .* (running|consuming) ")
        # A worker that dies (a `crash` job does it on purpose) is started again.
        pid = read_until(r"^worker-1 .*worker@[^:]+:(\d+):\w+ consuming ").group(1)
        read_until(rf"worker-1 started, pid {pid} \(`kill {pid}` to watch it come back\)")
        os.kill(int(pid), signal.SIGKILL)
        read_until(r"worker-1 exited with code -9; starting it again")
        read_until(r"^worker-1 .* consuming ")
        family = descendants(dev.pid)
        assert len(family) >= 7  # nats, redis, web, 2 schedulers, 2 workers (+ pool processes)
        dev.send_signal(signal.SIGINT)
        rest, _ = dev.communicate(timeout=60)
        text = "".join(output)
        assert dev.returncode == 0, text + rest
        assert "Traceback" not in text + rest
        time.sleep(0.2)
        assert [pid for pid in family if alive(pid)] == []
        assert (tmp_path / "var" / "nats" / "jetstream").is_dir()  # the file store lives in ./var
        assert not (tmp_path / "var" / "dev.env").exists()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        if dev.stdout is not None:
            dev.stdout.close()
