"""`docker compose up --build`, for real: the stack in containers, used as a new user would.

Runs when a Docker daemon answers and the compose file's four upstream images can be had
(pulled, or already there under their tags); otherwise it is skipped with one line saying why.
Each layout runs as its own compose project (`-p`, a unique name) on a free host port
(`MEGA_PORT`), and is always taken down with its volumes (`down -v`) at the end:

- `default`: app, two schedulers, two workers, NATS, Redis, PostgreSQL;
- `single`: one `mega work --with-scheduler` instead of the schedulers and workers;
- `cluster`: three routed NATS nodes, streams with three replicas, and the jobs stream's
  leader container stopped under load.

Each one: build and `up`, wait for every health check, log in, run ok/flaky/fail jobs to their
ends, requeue a dead letter, sign up through the outbox to every listener group, see ticks
with one winner (and one skipper where two schedulers run), SIGKILL the container running a
slow job and see the job done once after the replacement starts, then `stop`: every mega
container exits 0."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from mega.drivers.embedded import free_port
from tests.factories import csrf_from

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ("python:3.11-slim", "nats:2.12-alpine", "redis:7-alpine", "postgres:16-alpine")
GROUPS = {"WelcomeEmailListener", "SignupStatsListener", "WelcomeCreditListener", "CrmSyncListener"}
CLUSTER_URL = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"
T = TypeVar("T")

pytestmark = [pytest.mark.compose, pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class Layout:
    """One way to run the compose file: its flags, its environment, its mega services."""

    name: str
    flags: tuple[str, ...] = ()
    up_flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # Mega services and how many containers each runs.
    mega: dict[str, int] = field(default_factory=dict)
    nats: tuple[str, ...] = ("nats",)  # the NATS nodes (the cluster adds three)
    job_host: str = "worker"  # the service whose containers run jobs
    schedulers: int = 2  # processes that tick: a tick's winner and its skippers


LAYOUTS = [
    Layout("default", mega={"app": 1, "scheduler": 2, "worker": 2}),
    Layout(
        "single",
        flags=("--profile", "single"),
        up_flags=("--scale", "scheduler=0", "--scale", "worker=0"),
        mega={"app": 1, "work": 1},
        job_host="work",
        schedulers=1,
    ),
    Layout(
        "cluster",
        flags=("--profile", "cluster"),
        env={"NATS_URL": CLUSTER_URL, "MEGA_REPLICAS": "3"},
        mega={"app": 1, "scheduler": 2, "worker": 2},
        nats=("nats", "nats-1", "nats-2", "nats-3"),
    ),
]


def compose_command() -> list[str] | None:
    """Debian's docker-compose 1.29 where installed, else the `docker compose` plugin."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and run(["docker", "compose", "version"]).returncode == 0:
        return ["docker", "compose"]
    return None


def run(args: list[str], timeout_s: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, **kwargs)


def why_not() -> str | None:
    """Why the stack cannot run here, or None when it can."""
    try:
        return missing()
    except subprocess.TimeoutExpired as error:
        return f"`{' '.join(error.cmd)}` did not answer in {error.timeout:g} s"


def missing() -> str | None:
    if not shutil.which("docker") or run(["docker", "info"], timeout_s=20).returncode != 0:
        return "no Docker daemon answers (`docker info` fails)"
    if compose_command() is None:
        return "neither docker-compose nor `docker compose` is installed"
    for image in UPSTREAM:
        present = run(["docker", "image", "inspect", image]).returncode == 0
        if not present and run(["docker", "pull", "-q", image], timeout_s=300).returncode != 0:
            return f"{image} cannot be pulled and is not present (no registry, no stand-in)"
    return None


def until(check: Callable[[], T | None], what: str, timeout_s: float = 60) -> T:
    """Poll `check` until it returns something other than None (or False), within a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.2)


class Stack:
    """One compose project: its commands, its containers, its web app."""

    def __init__(self, layout: Layout, compose: list[str]) -> None:
        self.layout = layout
        self.project = f"megatest{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.password = secrets.token_urlsafe(12)
        self.base = [*compose, "-p", self.project, "-f", str(ROOT / "docker-compose.yml")]
        environment = {
            k: v for k, v in os.environ.items() if k not in ("NATS_URL", "MEGA_REPLICAS")
        }
        self.env = {
            **environment,
            "MEGA_SECRET_KEY": secrets.token_hex(32),
            "MEGA_DEMO_PASSWORD": self.password,
            "MEGA_PORT": str(self.port),
            # Healthy within 2 s of ready. Each check starts a Python in its container (0.1
            # CPU-s): at 1 s, the three stacks' checks were 600 processes and 60 CPU-s a run.
            "MEGA_HEALTHCHECK_INTERVAL": "2s",
            **layout.env,
        }

    def compose(self, *args: str, timeout_s: float = 120) -> str:
        result = run(
            [*self.base, *self.layout.flags, *args], timeout_s=timeout_s, cwd=ROOT, env=self.env
        )
        assert result.returncode == 0, f"compose {' '.join(args)}: {result.stderr[-3000:]}"
        return result.stdout

    def up(self) -> None:
        """`up -d --build`. The web port was free when the stack was made, but the build takes
        minutes and another test may take it meanwhile (docker then says "address already in
        use"): the stack takes another free port and comes up again, at most twice."""
        for tries_left in (2, 1, 0):
            try:
                self.compose("up", "-d", "--build", *self.layout.up_flags, timeout_s=600)
                return
            except AssertionError as error:
                if "address already in use" not in str(error) or not tries_left:
                    raise
                self.port = free_port()
                self.env["MEGA_PORT"] = str(self.port)

    def containers(self, service: str) -> list[str]:
        """The ids of the service's containers, stopped ones included, as `compose ps -q`
        gives them: asked of docker by compose's labels, because a compose command costs half
        a CPU-second (docker-compose 1.29 is a Python program) and the health wait asks often."""
        labels = (
            f"com.docker.compose.project={self.project}",
            f"com.docker.compose.service={service}",
            "com.docker.compose.oneoff=False",
        )
        filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
        result = run(["docker", "ps", "--all", "--quiet", "--no-trunc", *filters])
        assert result.returncode == 0, result.stderr
        return sorted(result.stdout.split())

    def inspect(self, container: str) -> dict[str, Any]:
        result = run(["docker", "inspect", container])
        state: dict[str, Any] = json.loads(result.stdout)[0]["State"]
        return state

    def runs(self, container: str, suffix: str) -> bool:
        """Whether the container's host is the instance with this suffix: each host logs its
        instance id (`worker worker@host:pid:suffix buses: ...`) when it starts."""
        logs = run(["docker", "logs", container])
        return f":{suffix} " in logs.stdout + logs.stderr

    def last_lines(self, container: str, n: int = 40) -> str:
        """A container's last `n` log lines, timestamped, under its name and exit state."""
        logs = run(["docker", "logs", "--timestamps", "--tail", str(n), container])
        state = self.inspect(container)
        head = f"--- {container[:12]}: exit {state['ExitCode']}, finished {state['FinishedAt']}"
        return f"{head}\n{logs.stdout}{logs.stderr}"

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", "--tail", "200", service)

    def all_healthy(self) -> bool:
        """Every long-running container healthy (the right number of each), migrate exited 0."""
        backing = dict.fromkeys((*self.layout.nats, "redis", "postgres", "migrate"), 1)
        for service, wanted in {**backing, **self.layout.mega}.items():
            ids = self.containers(service)
            if len(ids) != wanted:
                return False
            for container in ids:
                state = self.inspect(container)
                if service == "migrate":
                    if state["Status"] != "exited":
                        return False
                    assert state["ExitCode"] == 0, self.logs("migrate")
                elif state.get("Health", {}).get("Status") != "healthy":
                    return False
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(params=LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    reason = why_not()
    if reason is not None:
        pytest.skip(f"docker compose up not run: {reason}")
    compose = compose_command()
    assert compose is not None
    stack = Stack(request.param, compose)
    try:
        started = time.monotonic()
        stack.up()
        try:
            until(stack.all_healthy, "every service healthy", timeout_s=120)
        except AssertionError as error:  # say which one was not
            raise AssertionError(f"{error}:\n{stack.compose('ps')}") from None
        print(f"{stack.layout.name}: up --build and healthy in {time.monotonic() - started:.0f} s")
        yield stack
    finally:
        stack.compose("down", "-v", "--remove-orphans", "-t", "5", timeout_s=180)


class User:
    """The demo login, through the JSON routes, as the pages use them."""

    def __init__(self, stack: Stack) -> None:
        self.client = httpx.Client(base_url=stack.url, timeout=10)
        token = csrf_from(self.client.get("/login").text)
        form = {"username": "demo", "password": stack.password, "csrf_token": token}
        assert self.client.post("/login", data=form).status_code in (200, 303)
        self.headers = {"X-CSRF-Token": csrf_from(self.client.get("/demo").text)}

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        assert response.status_code == 200, (path, response.text)
        return response.json()["data"]

    def post(self, path: str, body: dict[str, Any], status: int = 200) -> Any:
        response = self.client.post(path, json=body, headers=self.headers)
        assert response.status_code == status, (path, response.text)
        return response.json()["data"]

    def job(self, job_id: str) -> dict[str, Any] | None:
        found = [job for job in self.get("/api/demo/jobs")["jobs"] if job["id"] == job_id]
        return found[0] if found else None

    def job_ends(self, job_id: str, status: str, timeout_s: float = 60) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job is not None and job["state"] == status else None

        return until(ended, f"job {job_id} {status}", timeout_s)


def enqueue(user: User, mode: str) -> str:
    job_id: str = user.post("/api/demo/jobs", {"to": f"{mode}@example.com", "mode": mode}, 201)[
        "id"
    ]
    return job_id


def jobs_reach_their_ends(user: User) -> None:
    ids = {mode: enqueue(user, mode) for mode in ("ok", "flaky", "fail")}
    ends = {"ok": ("done", 1), "flaky": ("done", 2), "fail": ("dlq", 3)}
    for mode, (status, attempts) in ends.items():
        assert user.job_ends(ids[mode], status)["attempts"] == attempts, mode
    dlq = user.get("/api/demo/jobs")["dlq"]
    assert [item["id"] for item in dlq["items"]] == [ids["fail"]] and dlq["count"] == 1
    # A requeue runs it again from attempt 1, and it fails its three attempts again.
    requeued_ms = time.time() * 1000
    requeued = user.post("/api/demo/jobs/dlq/requeue", {"id": ids["fail"]})
    assert requeued == {"requeued": 1, "left_crashed": 0}
    record = until(
        lambda: (
            (r := user.get(f"/api/demo/jobs/{ids['fail']}"))["state"] == "dlq"
            and r["finished_at"] > requeued_ms
            and r
        ),
        "the requeued job back in the DLQ",
    )
    assert record["attempts"] == 3 and len(record["history"]) == 2
    job = user.job(ids["fail"])
    assert job is not None
    assert job["lines"][3]["detail"] == "requeued from the DLQ: attempts count from 1 again"
    assert user.get("/api/demo/jobs")["dlq"]["count"] == 1


def a_signup_reaches_every_listener_group(user: User) -> None:
    signup = user.post("/api/demo/events/signup", {"email": "new@example.com", "mode": "ok"}, 201)
    assert signup["committed"] is True

    def heard() -> dict[str, Any] | None:
        events: list[dict[str, Any]] = user.get("/api/demo/events")["events"]
        for event in events:
            published = event["id"] == signup["event_id"] and event["status"] == "published"
            if published and set(event["listeners"].values()) == {"done"}:
                return event
        return None

    event = until(heard, "the signup heard by every listener group")
    assert set(event["listeners"]) == GROUPS


def ticks_have_one_winner(user: User, stack: Stack) -> None:
    """A scheduled tick has one winner; every other scheduler recorded a skip."""

    def tick() -> dict[str, Any] | None:
        ticks = user.get("/api/demo/cron")["ticks"]
        whole = [
            t for t in ticks if t["winner"] and len(t["skipped"]) == stack.layout.schedulers - 1
        ]
        return whole[0] if whole else None

    found = until(tick, "a tick with its winner and skippers", timeout_s=45)
    assert found["winner"] not in [s["instance"] for s in found["skipped"]]


def a_killed_worker_loses_no_job(user: User, stack: Stack) -> None:
    """SIGKILL the container running a slow job; with the replacement up, the job is done."""
    job_id = enqueue(user, "slow")

    def running_on() -> str | None:
        job = user.job(job_id)
        starts = (
            [line["detail"] for line in job["lines"] if line["kind"] == "running"] if job else []
        )
        match = re.search(r"on worker (\w+) \(pid", starts[0]) if starts else None
        return match.group(1) if match else None

    suffix = until(running_on, "the slow job started")
    victims = [c for c in stack.containers(stack.layout.job_host) if stack.runs(c, suffix)]
    assert len(victims) == 1, (suffix, victims)
    started_at = stack.inspect(victims[0])["StartedAt"]
    assert run(["docker", "kill", "-s", "KILL", victims[0]]).returncode == 0
    until(  # exited, or already restarted by its restart policy
        lambda: (
            (state := stack.inspect(victims[0]))["Status"] != "running"
            or state["StartedAt"] != started_at
        ),
        "the container dead",
        20,
    )
    assert run(["docker", "start", victims[0]]).returncode == 0  # the replacement
    job = user.job_ends(job_id, "done", timeout_s=90)
    kinds = [line["kind"] for line in job["lines"]]  # its first attempt lost with its worker
    assert kinds.count("done") == 1 and kinds.count("lost") == 1, kinds
    until(
        lambda: stack.inspect(victims[0]).get("Health", {}).get("Status") == "healthy",
        "the replacement healthy",
    )


def the_jobs_stream_leader_stops_under_load(user: User, stack: Stack) -> None:
    """Stop the container leading the jobs stream while jobs flow: every job is still done."""

    def leader() -> str | None:
        node = stack.containers("nats-1")[0]
        out = run(
            ["docker", "exec", node, "wget", "-qO-", "http://localhost:8222/jsz?streams=true"]
        )
        for account in json.loads(out.stdout or "{}").get("account_details", []):
            for stream in account.get("stream_detail", []):
                name: str = stream["name"]
                jobs = name.startswith("MEGA_JOBS_") and not name.endswith("_DLQ")
                if jobs and "EMAIL" in name.upper():
                    found: str | None = stream.get("cluster", {}).get("leader")
                    return found
        return None

    # Twenty in all: with the others, within the 30 jobs the page keeps.
    before = [enqueue(user, "ok") for _ in range(10)]
    name = until(leader, "the jobs stream's leader")
    node = stack.containers(name)[0]
    assert run(["docker", "stop", "-t", "5", node], timeout_s=30).returncode == 0
    after = [enqueue(user, "ok") for _ in range(10)]
    for job_id in before + after:
        user.job_ends(job_id, "done", timeout_s=60)  # fails unless each one ends done
    assert run(["docker", "start", node]).returncode == 0


def every_mega_container_stops_with_exit_0(stack: Stack) -> None:
    containers = {s: stack.containers(s) for s in stack.layout.mega}
    stack.compose("stop", timeout_s=180)
    codes = {s: [stack.inspect(c)["ExitCode"] for c in ids] for s, ids in containers.items()}
    failed = [c for ids in containers.values() for c in ids if stack.inspect(c)["ExitCode"]]
    assert codes == {s: [0] * n for s, n in stack.layout.mega.items()}, f"{codes}\n" + "\n".join(
        stack.last_lines(c) for c in failed
    )


def test_docker_compose_up_as_a_user(stack: Stack) -> None:
    user = User(stack)
    try:
        steps(user, stack)
    finally:
        user.client.close()


def steps(user: User, stack: Stack) -> None:
    jobs_reach_their_ends(user)
    a_signup_reaches_every_listener_group(user)
    a_killed_worker_loses_no_job(user, stack)
    if stack.layout.name == "cluster":
        the_jobs_stream_leader_stops_under_load(user, stack)
    ticks_have_one_winner(user, stack)
    every_mega_container_stops_with_exit_0(stack)
