"""Small factories shared by the tests: a config file per test, a booted web app, a client.

`write_config` / `config_for` make a framework-only config (the test site of
tests/mega/web/site.py, no schedules, jobs or workers): what the framework's tests use.
`sample_config` / `sample_config_for` make the sample application's: what tests/app uses."""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from mega.config import Config, load_config
from mega.runtime.bootstrap import boot, shutdown
from mega.web.accounts import ensure_user

TEST_SECRET = "test-secret-key-0123456789abcdef0123456789"
DEMO_USER, DEMO_PASSWORD = "demo", "demo-password"
# The framework's test application, and the sample's, as `web_app` names them.
FRAMEWORK_SITE = "tests.mega.web.site:create_app"
SAMPLE_APP = "app.web:create_app"
# The sample's registrations, as mega_config.py lists them.
SAMPLE_REGISTRATIONS = """
from app.events.listeners import LISTENERS
from app.events.relay_switch import relay_paused
from app.events.signups import UserSignedUp
from app.events.status import attach_event_status
from app.jobs.email import EmailJob
from app.jobs.observers import attach_job_observers
from app.jobs.pipeline import PublishJob, ResizeJob
from app.jobs.signup import ActivateAccountJob
from app.jobs.tenant import FairTenantJob, LimitedTenantJob, TenantJob
from app.schedules.cron_counter import CronCounterSchedule
from app.workers.hash_worker import HashWorker
schedules = [CronCounterSchedule]
jobs = [
    EmailJob, TenantJob, FairTenantJob, LimitedTenantJob, ActivateAccountJob, ResizeJob, PublishJob
]
workers = [HashWorker]
events = [UserSignedUp]
listeners = LISTENERS
outbox = {"paused": relay_paused, "poll_s": 0.1}
hooks = {"worker": [attach_job_observers], "listeners": [attach_event_status]}
"""


# One class of each kind, all valid, each listed: a config body `mega check` finds nothing in
# (a test breaks one with a line such as "Tidy.cron = 'x'"). Tidy's lock needs a redis_url.
DECLARATIONS = """
from mega import Event, Job, Listener, Schedule, Worker

class Signup(Event):
    name = "user.signed_up"
    bus = "jobs"

class Welcome(Listener):
    event = Signup

    async def run(self, event, ctx): ...

class Email(Job):
    subject = "email.send"
    bus = "jobs"

    async def run(self, payload, ctx): ...

class Tidy(Schedule):
    cron = "*/5 * * * *"
    timezone = "UTC"
    lock = {"lock": "main", "ttl": 20_000}

    async def run(self, ctx): ...

class Hash(Worker):
    task_file = "tests.mega.workers.worker_tasks"

schedules = [Tidy]
jobs = [Email]
workers = [Hash]
events = [Signup]
listeners = [Welcome]
"""


async def until_cancelled() -> None:
    """A run, or a loop's wait, that no time ends: only a cancel does (a time limit, a stop)."""
    await asyncio.Event().wait()


def write_config(
    tmp_path: Path,
    *,
    nats_url: str,
    redis_url: str | None,
    body: str = "",
    web_app: str = FRAMEWORK_SITE,
    name: str = "mega_config.py",
    bus: dict[str, Any] | None = None,
    **auth: Any,
) -> Path:
    """A config file for one test: its own servers, its own SQLite, `body` for the rest.
    Without `redis_url`, the config declares no cache and no lock. `bus`: the jobs bus's
    service entry (default the NATS server at `nats_url`)."""
    landing = "/demo" if web_app == SAMPLE_APP else "/home"
    auth_options = {
        "login_max_failures": 5,
        "login_window_s": 900,
        "landing_path": landing,
        "roles": {DEMO_USER: "admin"},
        **auth,
    }
    caches = (
        {
            "caches": {"main": {"driver": "redis", "url": redis_url}},
            "locks": {"main": {"driver": "redlock", "caches": ["main"]}},
        }
        if redis_url is not None
        else {}
    )
    path = tmp_path / name
    path.write_text(
        textwrap.dedent(
            f"""
            services = {{
                **{caches!r},
                "buses": {{"jobs": {bus or {"driver": "nats", "url": nats_url}!r}}},
                "database": {{"url": {f"sqlite:///{tmp_path / 'test.db'}"!r}}},
            }}
            web_app = {web_app!r}
            auth = {{"secret_key": {TEST_SECRET!r}, **{auth_options!r}}}
            """
        )
        + textwrap.dedent(body)
    )
    return path


def sample_config(
    tmp_path: Path,
    *,
    nats_url: str,
    redis_url: str,
    body: str = SAMPLE_REGISTRATIONS,
    bus: dict[str, Any] | None = None,
    **auth: Any,
) -> Path:
    """A config file for one test of the sample application (tests/app, tests/e2e)."""
    return write_config(
        tmp_path,
        nats_url=nats_url,
        redis_url=redis_url,
        body=body,
        web_app=SAMPLE_APP,
        bus=bus,
        **auth,
    )


class WebClient(httpx.AsyncClient):
    """An in-process client of one web app, which `app` names (the tests read its state)."""

    app: FastAPI


@asynccontextmanager
async def web_client(config: Config, *, pools: bool = False) -> AsyncIterator[WebClient]:
    """The config's web app booted on its servers, behind an in-process client.
    `pools` starts the config's CPU worker pools (child processes) as `mega start` does."""
    from mega.runtime.hosts import start_worker_pools, stop_worker_pools
    from mega.runtime.web_host import load_web_app, observe_web

    ctx = await boot(config, role="web")
    ensure_user(ctx.db, DEMO_USER, DEMO_PASSWORD)
    if pools:
        await start_worker_pools(config, ctx)
    app = load_web_app(config)(config, ctx)
    observe_web(config, ctx)
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
    try:
        async with WebClient(transport=transport, base_url="http://testserver") as client:
            client.app = app
            yield client
    finally:
        await stop_worker_pools(ctx)
        await shutdown(ctx)


def csrf_from(html: str) -> str:
    match = re.search(r'<meta name="csrf-token" content="([^"]+)"', html)
    assert match, "page has no csrf meta tag"
    return match.group(1)


async def login(
    client: httpx.AsyncClient, username: str = DEMO_USER, password: str = DEMO_PASSWORD
) -> httpx.Response:
    page = await client.get("/login")
    token = csrf_from(page.text)
    return await client.post(
        "/login", data={"username": username, "password": password, "csrf_token": token}
    )


async def authed(client: httpx.AsyncClient, page: str = "/demo") -> dict[str, str]:
    """Log in, then the CSRF header `page` carries for the session's JSON calls."""
    await login(client)
    return {"X-CSRF-Token": csrf_from((await client.get(page)).text)}


def config_for(tmp_path: Path, nats_url: str, redis_url: str, **auth: Any) -> Config:
    return load_config(write_config(tmp_path, nats_url=nats_url, redis_url=redis_url, **auth))


def sample_config_for(tmp_path: Path, nats_url: str, redis_url: str, **auth: Any) -> Config:
    return load_config(sample_config(tmp_path, nats_url=nats_url, redis_url=redis_url, **auth))


@asynccontextmanager
async def job_worker(config: Config) -> AsyncIterator[Any]:
    """A JobRunner on the config's jobs and hooks, in this process: what `mega worker` runs."""
    from mega.jobs.runner import JobRunner
    from mega.runtime.hosts import run_hooks

    ctx = await boot(config, role="worker", database=False)
    worker = JobRunner(ctx)
    for job in config.jobs:
        worker.register(job)
    await run_hooks(config, "worker", worker, ctx)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop(5)
        await shutdown(ctx)


@asynccontextmanager
async def worker_host(config: Config) -> AsyncIterator[list[Any]]:
    """What `mega worker` runs (outbox relay, listener groups, job worker), in this process."""
    ctx = await boot(config, role="worker", database=False)
    try:
        async with worker_parts_on(config, ctx) as runtimes:
            yield runtimes
    finally:
        await shutdown(ctx)


@asynccontextmanager
async def worker_parts_on(config: Config, ctx: Any) -> AsyncIterator[list[Any]]:
    """The parts of `mega worker` (relay, listener groups, job worker) started on `ctx`, and
    stopped at the end of the block; `ctx` stays the caller's."""
    from mega.runtime.hosts import run_hooks, worker_parts

    runtimes: list[Any] = []
    try:
        for part in worker_parts(config):
            runtime = part.make(ctx, instance_id=ctx.instance_id)
            for declaration in part.declarations:
                runtime.register(declaration)
            await run_hooks(config, part.hook, runtime, ctx)
            await runtime.start()
            runtimes.append(runtime)
        yield runtimes
    finally:
        for runtime in runtimes:
            await runtime.stop(5)
