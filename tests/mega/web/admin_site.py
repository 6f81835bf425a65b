"""An app on the framework alone that mounts the admin pages at /admin, and the classes its
config registers (ADMIN_DECLARATIONS): a job that fails while `Boom.failing` is True, a
listener group, a schedule with a lock (Tidy) and one without (Everywhere)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from mega import Config, Context, Event, Job, Listener, Schedule
from mega.web import admin_router, create_web_app


class Boom(Job):
    subject = "admin.boom"
    bus = "jobs"
    retries = 0
    concurrency = 20
    keep_result_s = 600
    failing = True

    async def run(self, payload: Any, ctx: Any) -> Any:
        if payload.get("fail") and type(self).failing:
            raise RuntimeError(f"boom {payload.get('n', 0)}")
        return {"sent": payload.get("to", "nobody")}


class Signup(Event):
    name = "user.signed_up"
    bus = "jobs"


class Welcome(Listener):
    event = Signup

    async def run(self, event: Any, ctx: Any) -> None: ...


class Tidy(Schedule):
    cron = "0 0 1 1 *"
    timezone = "UTC"
    lock = {"lock": "main", "ttl": 20_000}

    async def run(self, ctx: Any) -> None: ...


ADMIN_DECLARATIONS = """
from tests.mega.web.admin_site import Boom, Signup, Tidy, Welcome
jobs = [Boom]
events = [Signup]
listeners = [Welcome]
schedules = [Tidy]
"""


def create_app(config: Config, ctx: Context) -> FastAPI:
    return create_web_app(config, ctx, routers=[admin_router(prefix="/admin")], title="site")
