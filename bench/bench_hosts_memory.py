"""Idle memory of each host: `mega start` and `mega work` (target: < 100 MB), `mega scheduler`
and `mega worker` (target: < 50 MB).

Runs the four hosts with the real mega_config.py on private embedded NATS and Redis, waits
until each is ready, lets them idle a few seconds, and reads each process's VmRSS. The web
host's two CPU-pool children are reported on their own (they are separate processes). Then the
framework's own floor: `mega scheduler` and `mega worker` on a config of one schedule and one
no-op job (FLOOR_CONFIG), which imports nothing of the sample application.

    python -m bench.bench_hosts_memory
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.report import Result, print_table, result, row
from mega.drivers.embedded import free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.redis.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
# The target of each host (its command's name; "web" is `mega start`).
SECRET_KEY = "bench-secret-key-0123456789abcdef0123456789"
TARGETS_MB = {"web": 100.0, "work": 100.0, "scheduler": 50.0, "worker": 50.0}
IDLE_S = 3.0
READY_TIMEOUT_S = 30.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def wait_ready(log: Path, marker: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while marker not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log.name}: no {marker!r} in time")
        time.sleep(0.1)


FLOOR_CONFIG = """
from mega import Context, Schedule
from bench.jobs_noop import NoopJob


class Hourly(Schedule):
    cron = "0 0 * * * *"
    timezone = "UTC"

    async def run(self, ctx: Context) -> None:
        pass


services = {{
    "caches": {{"main": {{"driver": "redis", "url": {redis!r}}}}},
    "locks": {{"main": {{"driver": "redlock", "caches": ["main"]}}}},
    "buses": {{"jobs": {{"driver": "nats", "url": {nats!r}}}}},
}}
auth = {{"secret_key": {secret!r}}}
metrics = {{"enabled": False}}
schedules = [Hourly]
jobs = [NoopJob]
"""


def run() -> Result:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        nats = EmbeddedNats(data_dir=tmp / "nats").start()
        redis = EmbeddedRedis(data_dir=tmp / "redis").start()
        port = free_port()
        env = {
            **os.environ,
            "NATS_URL": nats.url,
            "REDIS_URL": redis.url,
            "DATABASE_URL": f"sqlite:///{tmp / 'bench.db'}",
            "MEGA_SECRET_KEY": SECRET_KEY,
        }
        sample = ["--config", str(ROOT / "mega_config.py")]
        # Each host its own metrics port: `mega work` serves the worker's.
        hosts = {
            "web": (["start", "--port", str(port), *sample], "web listening", env),
            "work": (
                ["work", *sample],
                "consuming 7 job",
                {**env, "MEGA_WORKER_METRICS_PORT": str(free_port())},
            ),
            "scheduler": (
                ["scheduler", *sample],
                "running 1 schedule",
                {**env, "MEGA_SCHEDULER_METRICS_PORT": str(free_port())},
            ),
            "worker": (
                ["worker", *sample],
                "consuming 7 job",
                {**env, "MEGA_WORKER_METRICS_PORT": str(free_port())},
            ),
        }
        floor = tmp / "floor_config.py"
        floor.write_text(FLOOR_CONFIG.format(redis=redis.url, nats=nats.url, secret=SECRET_KEY))
        floor_env = {**os.environ, "PYTHONPATH": str(ROOT)}
        hosts |= {
            "floor-scheduler": (
                ["scheduler", "--config", str(floor)],
                "running 1 schedule",
                floor_env,
            ),
            "floor-worker": (["worker", "--config", str(floor)], "consuming 1 job", floor_env),
        }
        processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, (args, _, host_env) in hosts.items():
                with open(tmp / f"{name}.log", "wb") as log:
                    processes[name] = subprocess.Popen(
                        [sys.executable, "-m", "mega", *args],
                        cwd=ROOT,
                        env=host_env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
            for name, (_, marker, _) in hosts.items():
                wait_ready(tmp / f"{name}.log", marker)
            deadline = time.monotonic() + 10  # "web listening" may come just before the bind
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            time.sleep(IDLE_S)
            rss = {name: rss_mb(p.pid) for name, p in processes.items()}
            pool = [rss_mb(pid) for pid in children(processes["web"].pid)]
        finally:
            for process in processes.values():
                process.terminate()
            for process in processes.values():
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
            nats.stop()
            redis.stop()
    rows = [
        row(
            f"`mega {'start' if name == 'web' else name}` RSS idle (MB)",
            rss[name],
            show=lambda v: f"{v:.1f}",
            target=f"< {target:.0f} MB",
            passed=rss[name] < target,
        )
        for name, target in TARGETS_MB.items()
    ]
    rows += [
        row(f"web's CPU pool child {n + 1} RSS idle (MB)", v, show=lambda v: f"{v:.1f}")
        for n, v in enumerate(pool)
    ]
    rows += [
        row(
            f"`mega {name}`, one {what}, mega alone: RSS idle (MB)",
            rss[f"floor-{name}"],
            show=lambda v: f"{v:.1f}",
        )
        for name, what in (("scheduler", "schedule"), ("worker", "no-op job"))
    ]
    res = result(
        "hosts_memory",
        "Hosts: idle memory",
        f"the four hosts with mega_config.py on embedded servers, {IDLE_S:.0f} s idle after "
        "ready; then a scheduler and a worker on a config of one schedule and one no-op job",
        rows,
        notes=[
            "VmRSS from /proc; the pool children are separate processes of `mega start`",
            "the floor rows import only mega and its dependencies (pydantic, nats-py, redis-py; "
            "no metrics server): what any app's host starts from. The sample's config adds "
            "SQLAlchemy and its application's modules (its listeners write to the database)",
            "redis-py loads the OpenTelemetry SDK's metrics when the SDK is installed, as it is "
            "here (the tests need it): a plain install of mega-py has no SDK, and its hosts take "
            "about 2.5 MB less",
        ],
        data={"rss_mb": rss, "pool_children_mb": pool},
    )
    print_table(res)
    return res


if __name__ == "__main__":
    sys.exit(0 if run()["passed"] else 1)
