"""The sample's web app: the framework's app plus the demo pages and their JSON routes."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from app.deps import BUS, POOL
from app.routes import (
    api_console,
    api_cron,
    api_events,
    api_jobs,
    api_worker,
    api_workflows,
    learn,
    pages,
)
from app.services.signups import create_tables
from app.workers.pool_log import PoolLog
from mega import Config, Context, EventBus, Scheduler
from mega.runtime import observe_jobs, observe_scheduler
from mega.web import admin_router, create_web_app, job_queue, provide

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def create_app(config: Config, ctx: Context) -> FastAPI:
    app = create_web_app(
        config,
        ctx,
        routers=[
            pages.router,
            api_console.router,
            api_cron.router,
            api_jobs.router,
            api_workflows.router,
            api_worker.router,
            api_events.router,
            learn.router,
            # The operator's pages over the whole fleet, from the framework (mega.web.admin).
            admin_router(prefix="/admin"),
        ],
        templates_dir=PROJECT_ROOT / "templates",
        static_dir=PROJECT_ROOT / "static",
        title="mega-py demo",
    )
    # Registered but never started here: `mega scheduler` ticks; the web app only runs manual
    # ticks (through the same lock) and reads the audit.
    scheduler = Scheduler(ctx)
    for schedule in config.schedules:
        scheduler.register(schedule)
    if config.metrics.enabled:
        observe_scheduler(scheduler)  # manual ticks count in the web app's /metrics
    provide(app, scheduler)
    # The web app enqueues and reads the DLQ; `mega worker` consumes.
    if config.metrics.enabled:
        observe_jobs(job_queue(app, BUS))  # enqueues count as `dispatch` in /metrics
    # The web app signs people up (their events go through the outbox) and reads the listeners'
    # dead letters; `mega worker` relays the outbox and runs the listeners.
    create_tables(ctx.db)
    provide(app, EventBus(ctx, BUS))
    # The pools start before the app is made (`mega start`): the worker page's pool log hears
    # of every child the hash pool replaces.
    pool_log = PoolLog()
    provide(app, pool_log)
    if POOL in ctx.workers:
        ctx.workers[POOL].on("replaced", pool_log.record)
    return app
