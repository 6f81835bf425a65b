"""The sample's web app: the framework's app plus the demo pages and their JSON routes."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from app.routes import api_console, api_cron, api_events, api_jobs, api_worker, learn, pages
from app.services.signups import create_tables
from app.workers.pool_log import PoolLog
from mega import Config, Context, EventBus, JobQueue, Scheduler, observe_jobs, observe_scheduler
from mega.web import create_web_app

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
            api_worker.router,
            api_events.router,
            learn.router,
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
    app.state.scheduler = scheduler
    # The web app enqueues and reads the DLQ; `mega worker` consumes.
    app.state.job_queue = JobQueue(ctx, "jobs")
    if config.metrics.enabled:
        observe_jobs(app.state.job_queue)  # enqueues count as `dispatch` in /metrics
    # The web app signs people up (their events go through the outbox) and reads the listeners'
    # dead letters; `mega worker` relays the outbox and runs the listeners.
    create_tables(ctx.db)
    app.state.event_bus = EventBus(ctx, "jobs")
    # The pools start before the app is made (`mega start`): the worker page's pool log hears
    # of every child the hash pool replaces.
    app.state.pool_log = PoolLog()
    if api_worker.POOL in ctx.workers:
        ctx.workers[api_worker.POOL].on("replaced", app.state.pool_log.record)
    return app
