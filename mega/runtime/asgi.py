"""`asgi_app()`: the web host as an ASGI app, for any ASGI server (`uvicorn pkg.module:app`).

    # pkg/asgi.py
    from mega.runtime import asgi_app

    app = asgi_app()        # $MEGA_CONFIG or ./mega_config.py, read at startup

Its lifespan does what `mega start` does before it listens: load the config, boot the context,
make the config's users, start the CPU pools, build the config's `web_app` and run the `web`
hooks; at shutdown it stops them in reverse. The server owns the signals and the socket: on
SIGTERM uvicorn finishes open requests, then runs the shutdown. One process per app: the pools
are the process's own.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from starlette.types import Receive, Scope, Send

from mega.config import load_config
from mega.runtime.web_host import web_app


class WebHost:
    """An ASGI app whose lifespan runs the web host and whose requests go to the app it built."""

    def __init__(self, config_path: str | Path | None = None) -> None:
        self.config_path = config_path
        self.app: Any = None  # the config's web app, while the lifespan runs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.app is None:
            raise RuntimeError("the web host has not started: run the server with lifespan on")
        else:
            await self.app(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        async with contextlib.AsyncExitStack() as stack:
            try:
                config = load_config(self.config_path)
                self.app = await stack.enter_async_context(web_app(config))
                # The app's own lifespan (its startup and shutdown handlers) inside the host's.
                await stack.enter_async_context(self.app.router.lifespan_context(self.app))
            except Exception as exc:  # the server prints the message and exits non-zero
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            self.app = None
        await send({"type": "lifespan.shutdown.complete"})


def asgi_app(config_path: str | Path | None = None) -> WebHost:
    """The web host as an ASGI app. Its config is read when the server starts it, so importing
    the module connects nothing.

    Args:
        config_path: the config file; None is $MEGA_CONFIG, else ./mega_config.py.
    """
    return WebHost(config_path)
