"""Idle memory of each host: `mega start`, `mega scheduler`, `mega worker` (target: < 100 MB).

Runs the three hosts with the real mega_config.py on private embedded NATS and Redis, waits
until each is ready, lets them idle a few seconds, and reads each process's VmRSS. The web
host's two CPU-pool children are reported on their own (they are separate processes).

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
from mega.runtime.embedded import EmbeddedNats, EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parents[1]
TARGET_MB = 100.0
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
            "MEGA_SECRET_KEY": "bench-secret-key-0123456789abcdef0123456789",
            "MEGA_SCHEDULER_METRICS_PORT": str(free_port()),
            "MEGA_WORKER_METRICS_PORT": str(free_port()),
        }
        hosts = {
            "web": (["start", "--port", str(port)], "web listening"),
            "scheduler": (["scheduler"], "running 1 schedule"),
            "worker": (["worker"], "consuming 7 job"),
        }
        processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name, (args, _) in hosts.items():
                with open(tmp / f"{name}.log", "wb") as log:
                    processes[name] = subprocess.Popen(
                        [sys.executable, "-m", "mega", *args,
                         "--config", str(ROOT / "mega_config.py")],
                        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    )  # fmt: skip
            for name, (_, marker) in hosts.items():
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
            value,
            show=lambda v: f"{v:.1f}",
            target=f"< {TARGET_MB:.0f} MB",
            passed=value < TARGET_MB,
        )
        for name, value in rss.items()
    ]
    rows += [
        row(f"web's CPU pool child {n + 1} RSS idle (MB)", v, show=lambda v: f"{v:.1f}")
        for n, v in enumerate(pool)
    ]
    res = result(
        "hosts_memory",
        "Hosts: idle memory",
        f"the three hosts with mega_config.py on embedded servers, {IDLE_S:.0f} s idle after ready",
        rows,
        notes=["VmRSS from /proc; the pool children are separate processes of `mega start`"],
        data={"rss_mb": rss, "pool_children_mb": pool},
    )
    print_table(res)
    return res


if __name__ == "__main__":
    sys.exit(0 if run()["passed"] else 1)
