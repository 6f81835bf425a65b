"""The one boot path every host shares: config -> adapters -> Context.

Hosts differ only in what they register afterwards (schedules, jobs, worker pools, the web app).
A dependency that cannot be reached raises DependencyUnavailable with one line naming the URL
and how to get one; the CLI prints that line and exits non-zero. A PostgreSQL database that is
not UTF8 is refused the same way (DatabaseEncodingError, from mega.database), by every host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from mega.config import Config
from mega.constants import CLOSE_TASKS_S
from mega.context import CacheAdapter, Context, new_instance_id
from mega.drivers import find_driver
from mega.errors import DependencyUnavailable, MegaError
from mega.tasks import cancel_and_wait

if TYPE_CHECKING:
    from mega.database import Database
    from mega.drivers.redis.client import RedisClient

logger = logging.getLogger("mega.boot")
# How long a stopping host waits for its connections to close.
CLOSE_TIMEOUT_S = 5.0


async def boot(config: Config, *, role: str, database: bool = True) -> Context:
    """Connect every declared service and return the Context. Closes what it opened on failure.

    Args:
        config: the loaded config, whose services are connected.
        role: what the host is ("web", "scheduler", "worker"...): the first part of the
            context's instance id, `<role>@<host>:<pid>:<random>`.
        database: whether to open the database now and bring the framework's tables to the
            newest migration; False leaves it to the first use of `ctx.db`, which does not
            migrate.
    """
    ctx = Context(
        instance_id=new_instance_id(role),
        database_url=config.database_url,
        middlewares=list(config.middlewares),
    )
    try:
        for alias, url in config.caches.items():
            ctx.caches[alias] = CacheAdapter(alias, url, await connect_redis(alias, url))
        for alias, cache_aliases in config.locks.items():
            from mega.schedules.locks import RedLock  # imported only by configs that declare locks

            clients = [ctx.caches[name].native for name in cache_aliases]
            ctx.locks[alias] = RedLock(alias, clients)
        for alias, spec in config.buses.items():
            if spec.driver == "postgres" and not spec.url:
                spec = spec.model_copy(update={"url": config.database_url})
            ctx.buses[alias] = await find_driver(spec.driver).connect(alias, spec)
        if database:
            ctx.database = await connect_database(config.database_url)
    except BaseException:
        await shutdown(ctx)
        raise
    return ctx


async def shutdown(ctx: Context) -> None:
    """Close every connection the context holds, all at once, within CLOSE_TIMEOUT_S: a server
    that stopped answering (a NATS client flushes on close, up to 10 s per flush) must not keep
    a stopping host past its grace period. Never raises.

    Args:
        ctx: the context `boot` made; its buses and caches are closed and its database, if
            open, disposed of.
    """
    closes = [
        *(_closing(f"bus {alias!r}", bus.close()) for alias, bus in ctx.buses.items()),
        *(_closing(f"cache {alias!r}", c.native.aclose()) for alias, c in ctx.caches.items()),
    ]
    if closes:
        _, late = await asyncio.wait(closes, timeout=CLOSE_TIMEOUT_S)
        if late:
            names = ", ".join(sorted(task.get_name() for task in late))
            logger.warning(
                "%s not closed within %.0f s (its server does not answer?); left to the exit",
                names,
                CLOSE_TIMEOUT_S,
            )
            await cancel_and_wait(late, CLOSE_TASKS_S)
    if ctx.database is not None:
        ctx.database.dispose()


def _closing(name: str, close: Awaitable[object]) -> asyncio.Task[None]:
    async def quietly() -> None:
        with contextlib.suppress(Exception):
            await close

    return asyncio.create_task(quietly(), name=name)


async def connect_redis(alias: str, url: str, *, decode_responses: bool = True) -> RedisClient:
    """A cache's client: the redis driver's connection (str replies by default), to one server
    or a Redis Cluster (`redis+cluster://`)."""
    # ~0.1 s to import: only for configs that declare caches
    from mega.drivers.redis.client import connect_redis as connect

    return await connect(alias, url, decode_responses=decode_responses)


async def connect_database(url: str) -> Database:
    """Open the database and bring the framework's tables to the newest migration."""
    return await open_database(url, migrate=True)


async def open_database(url: str, *, migrate: bool) -> Database:
    """Open the database (and apply pending migrations when `migrate`); one clear line when it
    cannot be reached."""
    # Imported here: SQLAlchemy costs ~0.3 s to import and only the web host needs it.
    from mega.database import Database

    db = Database(url)
    try:
        await asyncio.to_thread(db.ping)
        if migrate:
            from mega.runtime.migrate import is_current, upgrade

            before: str | None = "current"
            after = "current"
            if not await asyncio.to_thread(is_current, db):
                before, after = await asyncio.to_thread(upgrade, db)
            if before != after:
                logger.info(
                    "database %s upgraded from %s to %s", db.redacted_url, before or "empty", after
                )
    except MegaError:  # it answered and was refused (its encoding): said as it is
        db.dispose()
        raise
    except Exception as exc:
        db.dispose()
        raise DependencyUnavailable(
            "db", f"cannot open the database at {db.redacted_url} ({_reason(exc)})"
        ) from exc
    return db


async def check_database(url: str) -> None:
    """For the hosts that open the database only on first use (scheduler, worker, work):
    refuse at start a PostgreSQL database that mega refuses (its encoding), as `mega start` and
    `mega db upgrade` do. One that does not answer yet is left to its first use, as before: the
    outbox relay waits for it."""
    if not url.startswith(("postgresql", "postgres:")):
        return  # SQLite is always UTF-8, and a worker on it starts without SQLAlchemy (~0.3 s)
    try:
        db = await open_database(url, migrate=False)
    except DependencyUnavailable as exc:
        logger.warning("%s; its encoding is checked on first use", exc.message)
        return
    db.dispose()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
