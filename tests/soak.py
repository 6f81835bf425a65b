"""`make soak`: the whole demo under mixed load, with a worker SIGKILLed every 30 s.

    .venv/bin/python -m tests.soak [--duration-s 600]      (SOAK_S sets the default; CI: 120)

Starts its own nats-server and Redis, then `mega start`, `mega scheduler` and two `mega worker`
processes with the sample's mega_config.py, exactly as an operator runs them. For the duration:
an EmailJob every 0.25 s (ok, flaky, fail in turn), a signup every second (its event goes
through the outbox to four listener groups), a pool hash every 3 s, the CronCounter ticking
every 30 s; and every 30 s the second worker is SIGKILLed and a new one started. Then the load
stops and the stack drains. It passes when:

- nothing is lost: every ok and flaky job is done, every fail job is in the DLQ, every
  committed signup's event was heard by all four groups, no tick instant ran twice;
- the web, scheduler and first worker hold their RSS within 10% of its value after warm-up;
- no host logged an error or a traceback other than the provoked ones (the fail jobs' own).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

from mega.drivers.embedded import free_port
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.redis.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
MODES = ("ok", "flaky", "fail")
KILL_EVERY_S = 30.0
RSS_TOLERANCE = 0.10
DRAIN_TIMEOUT_S = 150.0
GROUPS = ("WelcomeEmailListener", "SignupStatsListener", "WelcomeCreditListener", "CrmSyncListener")
# Lines a fail job provokes on purpose (its retries and its dead letter), never a finding.
PROVOKED = re.compile(r"SimulatedSendError|WorkerCrashed")


class Stack:
    """The four hosts, their logs, and the servers under them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nats = EmbeddedNats(data_dir=tmp / "nats").start()
        self.redis = EmbeddedRedis(data_dir=tmp / "redis").start()
        self.port = free_port()
        self.password = secrets.token_urlsafe(12)
        self.env = {
            **os.environ,
            "NATS_URL": self.nats.url,
            "REDIS_URL": self.redis.url,
            "DATABASE_URL": f"sqlite:///{tmp / 'soak.db'}",
            "MEGA_SECRET_KEY": secrets.token_hex(32),
            "MEGA_DEMO_USER": "demo",
            "MEGA_DEMO_PASSWORD": self.password,
            "MEGA_SCHEDULER_METRICS_PORT": str(free_port()),
            "MEGA_METRICS_BIND": "127.0.0.1",
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[Path] = []
        self.spawned = itertools.count(1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, name: str, *args: str) -> None:
        log_path = self.tmp / f"{name}-{next(self.spawned)}.log"
        self.logs.append(log_path)
        env = {**self.env, "MEGA_WORKER_METRICS_PORT": str(free_port())}  # one per worker
        with open(log_path, "wb") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "mega", *args, "--config", str(ROOT / "mega_config.py")],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def start(self) -> None:
        self.spawn("web", "start", "--port", str(self.port))
        self.spawn("scheduler", "scheduler")
        self.spawn("worker1", "worker")
        self.spawn("worker2", "worker")

    def kill_and_replace(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)
        self.processes[name].wait()
        self.spawn(name, "worker")

    def rss_mb(self, name: str) -> float:
        status = Path(f"/proc/{self.processes[name].pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                process.kill()
        self.nats.stop()
        self.redis.stop()

    def error_lines(self) -> list[str]:
        found = []
        for path in self.logs:
            for line in path.read_text(errors="replace").splitlines():
                if (" ERROR " in line or "Traceback" in line) and not PROVOKED.search(line):
                    found.append(f"{path.name}: {line}")
        return found


async def log_in(client: httpx.AsyncClient, password: str) -> str:
    """Log in as the demo user; returns the session's CSRF token for the JSON routes."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if (await client.get("/healthz")).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("soak: the web app did not answer /healthz in 30 s")
        await asyncio.sleep(0.2)
    token = _csrf((await client.get("/login")).text)
    await client.post(
        "/login", data={"username": "demo", "password": password, "csrf_token": token}
    )
    return _csrf((await client.get("/demo")).text)


def _csrf(html: str) -> str:
    match = re.search(r'<meta name="csrf-token" content="([^"]+)"', html)
    if match is None:
        raise SystemExit("soak: no CSRF token on the page (is the login right?)")
    return match.group(1)


async def drive(stack: Stack, duration_s: float, warmup_s: float) -> dict[str, Any]:
    jobs: dict[str, str] = {}  # job id -> mode
    events: list[str] = []
    answers: Counter[str] = Counter()
    rss_after_warmup: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        token = await log_in(client, stack.password)
        headers = {"X-CSRF-Token": token}
        started = time.monotonic()
        next_kill = started + KILL_EVERY_S
        for tick in itertools.count():
            now = time.monotonic()
            if now - started >= duration_s:
                break
            if not rss_after_warmup and now - started >= warmup_s:
                rss_after_warmup = {n: stack.rss_mb(n) for n in ("web", "scheduler", "worker1")}
            if now >= next_kill:
                stack.kill_and_replace("worker2")
                answers["worker SIGKILLed"] += 1
                next_kill += KILL_EVERY_S
            mode = MODES[tick % 3]
            sent = await client.post(
                "/api/demo/jobs",
                json={"to": f"soak{tick}@example.com", "mode": mode},
                headers=headers,
            )
            answers[f"job {sent.status_code}"] += 1
            if sent.status_code == 201:
                jobs[sent.json()["data"]["id"]] = mode
            if tick % 4 == 0:
                signup = await client.post(
                    "/api/demo/events/signup",
                    json={"email": f"soak{tick}@example.com"},
                    headers=headers,
                )
                answers[f"signup {signup.status_code}"] += 1
                if signup.status_code == 201:
                    events.append(signup.json()["data"]["event_id"])
            if tick % 12 == 0:
                hashed = await client.post(
                    "/api/demo/worker/hash", json={"rounds": 200_000}, headers=headers
                )
                answers[f"hash {hashed.status_code}"] += 1
            await asyncio.sleep(0.25)
    return {"jobs": jobs, "events": events, "answers": answers, "rss": rss_after_warmup}


async def drained(stack: Stack, jobs: dict[str, str], events: list[str]) -> list[str]:
    """Wait for every job and event to reach its end; returns what is still missing. A job's
    end is its status record's state (GET /api/demo/jobs/{id}); each is read until it ends."""
    redis = Redis.from_url(stack.redis.url, decode_responses=True)
    expected = {"ok": "done", "flaky": "done", "fail": "dlq"}
    pending = dict(jobs)
    states: dict[str, str | None] = {}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    try:
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
            await log_in(client, stack.password)
            while True:
                for job_id in list(pending):
                    answer = await client.get(f"/api/demo/jobs/{job_id}")
                    state = answer.json()["data"]["state"] if answer.status_code == 200 else None
                    states[job_id] = state
                    if state == expected[pending[job_id]]:
                        del pending[job_id]
                async with redis.pipeline(transaction=False) as pipe:
                    for event_id in events:
                        pipe.hgetall(f"demo:events:status:{event_id}")
                    replies = await pipe.execute()
                missing = [
                    f"job {job_id} ({mode}): {states.get(job_id)}"
                    for job_id, mode in pending.items()
                ] + [
                    f"event {event_id}: {heard}"
                    for event_id, heard in zip(events, replies, strict=True)
                    if any(heard.get(group) != "done" for group in GROUPS)
                ]
                if not missing or time.monotonic() > deadline:
                    return missing
                await asyncio.sleep(1.0)  # a poll of the replies, with a deadline
    finally:
        await redis.aclose()


async def ticks_ran_twice(redis_url: str) -> list[str]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        history = await redis.lrange("demo:cron:history", 0, -1)
    finally:
        await redis.aclose()
    records = [json.loads(item) for item in history]
    instants = Counter(r["at"] for r in records if r.get("source") == "schedule")
    return [at for at, count in instants.items() if count > 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=float(os.environ.get("SOAK_S", 600)))
    args = parser.parse_args()
    duration_s = args.duration_s
    warmup_s = min(60.0, duration_s / 4)
    with tempfile.TemporaryDirectory(prefix="mega-soak-") as tmp_dir:
        stack = Stack(Path(tmp_dir))
        try:
            stack.start()
            print(
                f"soak: {duration_s:.0f} s of load on {stack.url}, a worker killed every "
                f"{KILL_EVERY_S:.0f} s",
                flush=True,
            )
            run = asyncio.run(drive(stack, duration_s, warmup_s))
            missing = asyncio.run(drained(stack, run["jobs"], run["events"]))
            rss_end = {name: stack.rss_mb(name) for name in run["rss"]}
            twice = asyncio.run(ticks_ran_twice(stack.redis.url))
            errors = stack.error_lines()
        finally:
            stack.stop()
    problems = [f"not finished: {item}" for item in missing[:20]]
    problems += [f"tick ran twice: {at}" for at in twice]
    for name, before in run["rss"].items():
        growth = rss_end[name] / before - 1
        print(
            f"soak: {name} RSS {before:.1f} MB after warm-up, {rss_end[name]:.1f} MB at the end "
            f"({growth:+.1%})"
        )
        if growth > RSS_TOLERANCE:
            problems.append(f"{name} RSS grew {growth:.1%} (limit {RSS_TOLERANCE:.0%})")
    problems += [f"log: {line}" for line in errors[:20]]
    print(
        f"soak: {len(run['jobs'])} jobs, {len(run['events'])} signups; answers "
        f"{dict(sorted(run['answers'].items()))}"
    )
    for problem in problems:
        print(f"soak: FAIL {problem}")
    print("soak: pass" if not problems else f"soak: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
