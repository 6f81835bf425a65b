"""A web app with the operator console for the scale curves: a config on one bus driver with
the jobs a curve names, booted as `mega start` boots it, behind an in-process HTTP client that
carries an API token (the console's pages answer it as a logged-in operator).

    body = "from bench.bench_dlq import Doomed\\njobs = [Doomed]\\n"
    async with console(tmp, "redis", urls, body) as (client, ctx, config):
        page = await client.get("/admin/dlq/Doomed")
"""

from __future__ import annotations

import secrets
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from mega import Config, Context, load_config
from mega.runtime import boot, shutdown
from mega.web import admin_router, create_web_app
from mega.web.tokens import create_token


def create_app(config: Config, ctx: Context) -> FastAPI:
    return create_web_app(config, ctx, routers=[admin_router(prefix="/admin")], title="scale")


def write_config(folder: Path, driver: str, urls: dict[str, str], body: str) -> Path:
    """A config whose bus `jobs` is on `driver`, with a cache on the Redis and a SQLite."""
    bus: dict[str, Any] = {"driver": driver}
    if driver != "memory":
        bus["url"] = urls[driver]
    path = folder / f"scale_{driver}.py"
    path.write_text(
        textwrap.dedent(f"""
        services = {{
            "caches": {{"main": {{"driver": "redis", "url": {urls["redis"]!r}}}}},
            "locks": {{"main": {{"driver": "redlock", "caches": ["main"]}}}},
            "buses": {{"jobs": {bus!r}}},
            "database": {{"url": {f"sqlite:///{folder / f'scale_{driver}.db'}"!r}}},
        }}
        web_app = "bench.scale.site:create_app"
        auth = {{"secret_key": {secrets.token_hex(32)!r}}}
    """)
        + textwrap.dedent(body)
    )
    return path


@asynccontextmanager
async def console(
    folder: Path, driver: str, urls: dict[str, str], body: str
) -> AsyncIterator[tuple[httpx.AsyncClient, Context, Config]]:
    """The app booted on `driver`, an HTTP client with an operator's token, its context."""
    from mega.runtime.web_host import load_web_app

    config = load_config(write_config(folder, driver, urls, body))
    ctx = await boot(config, role="web")
    try:
        token = await ctx.db.run(lambda session: create_token(session, "scale-bench"))
        app = load_web_app(config)(config, ctx)
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://scale", headers=headers
        ) as client:
            yield client, ctx, config
    finally:
        await shutdown(ctx)
