"""The web host (`mega start`): the app with what it serves running (`web_app`, which
`mega.runtime.asgi_app` also serves under any ASGI server), served by uvicorn until
SIGINT/SIGTERM, then stopped in order (mega/runtime/hosts.py has what every host shares).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from mega.config import Config
from mega.context import Context
from mega.errors import ConfigError, MegaError
from mega.runtime.bootstrap import boot, shutdown
from mega.runtime.check import enforce
from mega.runtime.hosts import (
    freeze_startup_heap,
    lost_for_good,
    run_hooks,
    settle_lost,
    start_worker_pools,
    stop_worker_pools,
    watch_buses,
)
from mega.runtime.stopping import StopSignals, stopped_while_starting

logger = logging.getLogger("mega.host")


def check_port_free(host: str, port: int) -> None:
    """Raise a one-line MegaError when `host:port` cannot be bound (uvicorn would otherwise
    fail with a traceback, after the pools had started)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise MegaError(
                f"cannot listen on {host}:{port} ({exc.strerror}); is another server running "
                "there? Pick another port with --port (make run PORT=8123)",
                code="web.port_in_use",
            ) from None


async def run_web(config: Config, host: str, port: int) -> None:
    check_port_free(host, port)
    enforce(config, logger.warning)  # a bad class is named before any server is reached
    with StopSignals() as signals, stopped_while_starting(signals, "web"):
        await _serve(config, signals, host, port)


async def _serve(config: Config, signals: StopSignals, host: str, port: int) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn, minus its own signal handling: it re-raises SIGTERM after shutting down,
        which would kill the host before it stops its pools and exits 0. We own the signals."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    lost = asyncio.get_running_loop().create_future()
    async with web_app(config, when_lost=functools.partial(settle_lost, lost)) as app:
        server = Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_config=None,
                access_log=False,
                lifespan="off",
                proxy_headers=True,
                timeout_graceful_shutdown=10,
            )
        )
        stop = signals.running_until_signal()
        freeze_startup_heap()
        logger.info("web listening on http://%s:%d", host, port)
        serving: asyncio.Future[Any] = asyncio.create_task(server.serve())
        await asyncio.wait([serving, stop, lost], return_when=asyncio.FIRST_COMPLETED)
        if stop.done():
            logger.info("%s received: finishing open requests", stop.result())
        server.should_exit = True
        await serving
    logger.info("web stopped")
    if lost.done():
        raise lost_for_good("web", lost.result())


@contextlib.asynccontextmanager
async def web_app(
    config: Config, *, when_lost: Callable[[str], None] | None = None
) -> AsyncIterator[Any]:
    """The web host's app, with what it serves running: the context booted, the config's users
    made, commits announced to the relays, the CPU pools started, the `web` hooks run. On exit
    all of it stops, in reverse. `mega start` serves it, and so does `mega.runtime.asgi_app`
    under any ASGI server."""
    ctx = await boot(config, role="web")
    if when_lost is not None:
        watch_buses(ctx, when_lost)
    stop_announcing: Callable[[], None] = lambda: None  # noqa: E731
    try:
        if config.auth.users:
            from mega.web.accounts import ensure_user

            for username, password in config.auth.users.items():
                await asyncio.to_thread(ensure_user, ctx.db, username, password)
        if config.events or config.jobs:  # relays hear of each commit that adds outbox rows
            from mega.transactional.relay import announce_commits

            stop_announcing = announce_commits(ctx)
        await start_worker_pools(config, ctx)
        app = load_web_app(config)(config, ctx)
        observe_web(config, ctx)
        await run_hooks(config, "web", app, ctx)
        yield app
    finally:
        stop_announcing()
        await stop_worker_pools(ctx)
        await shutdown(ctx)


def observe_web(config: Config, ctx: Context) -> None:
    """What the web app's /metrics exports beyond its app's own observers: the depth of the
    config's job queues."""
    if config.metrics.enabled and config.jobs:
        from mega.runtime.metrics import observe_queues

        observe_queues(ctx, config.jobs)


def load_web_app(config: Config) -> Callable[[Config, Context], Any]:
    """Import `config.web_app` ("package.module:factory"), or the framework's bare app."""
    if not config.web_app:
        from mega.web.app import create_web_app

        return lambda cfg, ctx: create_web_app(cfg, ctx)
    module_name, _, attr = config.web_app.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr or "create_app")
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"web_app: cannot load {config.web_app!r} ({exc})") from exc
    return factory  # type: ignore[no-any-return]
